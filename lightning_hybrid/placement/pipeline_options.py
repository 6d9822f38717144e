"""The settings of a placed pipeline, checked before any process starts: stages, replicas and
micro-batches, the placement method or stage sizes, the schedule, the replicas' gradient sync, the
optimizer's state slots and the devices (plain Python), then the stage sizes against a model's blocks.

:class:`~lightning_hybrid.HybridParallelStrategy` checks its arguments with
:func:`check_pipeline_options`, and each module it is given with :func:`check_stage_sizes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_hybrid.devices import Device, devices_from_config
from lightning_hybrid.pipeline.schedules import SCHEDULES
from lightning_hybrid.placement.plan import METHODS

#: How the replicas of a pipeline average their gradients: after each step, or ``delay`` steps later.
GRADIENT_SYNCS = ("sync", "delayed")


def _count(name: str, value: Any, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be a {'positive' if least else 'non-negative'} integer, got {value!r}")


def check_pipeline_options(
    pipeline_stages: int,
    data_parallel: int,
    placement: str | Sequence[int],
    schedule: str,
    micro_batches: int | str,
    gradient_sync: str,
    delay: int,
    optimizer_slots: int,
    devices: Sequence[Any] | None,
) -> tuple[str | list[int], list[Device] | None]:
    """Refuse settings a pipeline cannot run, saying what to give; ``placement`` (a method's name, or
    the stage sizes as ints) and ``devices`` as :class:`~lightning_hybrid.devices.Device` (None: to be
    probed)."""
    for name, value in (("pipeline_stages", pipeline_stages), ("data_parallel", data_parallel)):
        _count(name, value, 1)
    if micro_batches != "auto":
        if isinstance(micro_batches, str):
            raise ValueError(f"micro_batches must be 'auto' or a positive integer, got {micro_batches!r}")
        _count("micro_batches", micro_batches, 1)
    if isinstance(placement, str):
        if placement not in METHODS:
            raise ValueError(f"placement must be one of {', '.join(METHODS)} or a list of stage sizes, got {placement!r}")
    else:
        placement = [int(size) for size in placement]
        if len(placement) != pipeline_stages or min(placement) < 1:
            raise ValueError(f"placement as stage sizes needs {pipeline_stages} positive block counts, got {placement}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if schedule == "1F1B" and micro_batches != "auto" and micro_batches < pipeline_stages:
        raise ValueError(
            f"schedule='1F1B' needs at least as many micro-batches as stages, got micro_batches={micro_batches} "
            f"for pipeline_stages={pipeline_stages}; raise micro_batches or use schedule='GPipe'"
        )
    if gradient_sync not in GRADIENT_SYNCS:
        raise ValueError(f"gradient_sync must be 'sync' or 'delayed', got {gradient_sync!r}")
    _count("delay", delay, 0)
    _count("optimizer_slots", optimizer_slots, 0)
    specs = None if devices is None else devices_from_config(list(devices))
    if specs is not None and len(specs) != pipeline_stages:
        raise ValueError(
            f"devices describes {len(specs)} devices but pipeline_stages={pipeline_stages}; "
            "give one description per pipeline position"
        )
    return placement, specs


def check_stage_sizes(block_names: Sequence[str], pipeline_stages: int, placement: str | Sequence[int]) -> None:
    """Refuse more stages than the model has blocks (``block_names``), and stage sizes that do not add
    up to its blocks."""
    blocks = len(block_names)
    if blocks < pipeline_stages:
        raise ValueError(
            f"pipeline_stages={pipeline_stages} but the model has only {blocks} blocks ({', '.join(block_names)}); "
            f"use at most {blocks} stages"
        )
    if not isinstance(placement, str) and sum(placement) != blocks:
        raise ValueError(f"placement stage sizes {list(placement)} add up to {sum(placement)} blocks, the model has {blocks}")
