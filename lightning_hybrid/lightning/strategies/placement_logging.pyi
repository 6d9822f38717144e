# Generated from lightning_hybrid/strategies/placement_logging.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
from collections.abc import Sequence
from typing import Any
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from lightning_hybrid.devices import Device
from lightning_hybrid.placement import Placement
from lightning_hybrid.placement.figure import format_placement, placement_figure

def log_placement(loggers: Sequence[Any], placement: Placement, devices: list[Device], names: list[str], ranks: list[list[int]], schedule: str, micro_batches: int) -> None:
    ...
