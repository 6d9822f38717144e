# Generated from lightning_hybrid/strategies/placement_logging.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""Strategy glue: a pipeline's placement logged to the Trainer's TensorBoard loggers, as text and as a figure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lightning_hybrid.devices import Device
from lightning_hybrid.placement import Placement
from lightning_hybrid.placement.figure import format_placement, placement_figure


def log_placement(loggers: Sequence[Any], placement: Placement, devices: list[Device], names: list[str],
                  ranks: list[list[int]], schedule: str, micro_batches: int) -> None:
    """The placement in use to each TensorBoard logger of ``loggers``, as text (``add_text``) and as a figure
    (``add_figure``, tag ``"placement"``, step 0; matplotlib). ``ranks``: each stage's ranks, one per replica."""
    loggers = [lg for lg in loggers if isinstance(lg, TensorBoardLogger)]
    if not loggers:
        return
    # stage times are per micro-batch: the blocks were profiled on one micro-batch of the first batch
    drawn = dict(placement=placement, devices=devices, block_names=names, ranks=ranks, time_unit="micro-batch")
    text = format_placement(**drawn)
    text += f"\n\n{schedule} schedule, {micro_batches} micro-batches per batch, {len(ranks[0])} replica(s)"
    try:
        figure = placement_figure(**drawn, micro_batches=micro_batches, schedule=schedule)
    except ImportError:
        figure = None
        rank_zero_warn(
            'HybridParallelStrategy logs its placement to TensorBoard as text only: matplotlib is not installed; '
            '`pip install "lightning-hybrid[plots]"` draws the placement figure too.',
            category=UserWarning,
        )
    for i, logger in enumerate(loggers):
        logger.experiment.add_text("placement", text, global_step=0)
        if figure is not None:  # closed once the last logger has it
            logger.experiment.add_figure("placement", figure, global_step=0, close=i == len(loggers) - 1)
