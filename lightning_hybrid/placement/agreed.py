"""A pipeline's placement as every rank agrees on it: the devices it is planned for (given, in speeds relative
to this machine, or each pipeline position's speed and free memory probed on its rank), capped at the memory
budget, and one plan made by rank 0 and broadcast, or its error raised on every rank (plain: the hybrid
strategy calls it at set-up or at the first batch)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from lightning_hybrid.comm.collectives import all_gather_object, broadcast_object
from lightning_hybrid.devices import Device, devices_in_flops, free_memory, probe_speed
from lightning_hybrid.placement import Placement
from lightning_hybrid.placement.pipeline_stages import within_budgets


def planning_devices(given: Sequence[Device] | None, positions: int, device: torch.device, slowdown: float | None,
                     budget: int | list[int] | None) -> list[Device]:
    """The pipeline positions' devices in FLOP/s: ``given`` (speeds relative to this machine's probed FLOP/s, so
    that compute and transfer times are both in seconds), or else each of the first ``positions`` ranks' probed
    speed (slowed as its stage's compute is) and free memory (every rank calls it: an all-gather); memory capped at
    ``budget`` (:func:`~lightning_hybrid.placement.pipeline_stages.within_budgets`)."""
    if given is not None:
        devices = devices_in_flops(given, "relative", probe_speed(device))
    else:
        measured = all_gather_object((probe_speed(device, slowdown=slowdown), free_memory(device)))
        devices = [Device(f"rank{p}", speed=s, memory=m) for p, (s, m) in enumerate(measured[:positions])]
    return within_budgets(devices, budget)


def agreed_placement(rank: int, plan: Callable[[], Placement]) -> Placement:
    """Rank 0's ``plan()`` on every rank (a broadcast), or its error raised on every rank, not only rank 0."""
    planned: Placement | Exception | None = None
    if rank == 0:
        try:
            planned = plan()
        except Exception as error:  # every rank must learn of it
            planned = error
    planned = broadcast_object(planned, src=0)
    if isinstance(planned, Exception):
        raise planned
    return planned
