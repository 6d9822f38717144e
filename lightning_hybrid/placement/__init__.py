"""Placing a model's blocks on heterogeneous devices as pipeline stages (paper 003's GABRA and others).

Algorithms only, no Lightning: :func:`plan` takes :class:`Block` costs (from
:func:`profile_blocks`) and :class:`Device` descriptions and returns a :class:`Placement`.
``Device``, ``devices_from_config`` and ``probe_speed`` live in :mod:`lightning_hybrid.devices`
(with what a speed means) and are re-exported here. :mod:`~lightning_hybrid.placement.pipeline_stages`
profiles a model's blocks and places them (what :class:`~lightning_hybrid.HybridParallelStrategy` runs).
"""

from lightning_hybrid.devices import Device, devices_from_config, probe_speed
from lightning_hybrid.placement.cost import profile_blocks
from lightning_hybrid.placement.gabra import GABRA
from lightning_hybrid.placement.plan import METHODS, compare, format_comparison, plan
from lightning_hybrid.placement.problem import Block, InfeasiblePlacementError, Placement, Problem, Stage

__all__ = [
    "GABRA", "METHODS", "Block", "Device", "InfeasiblePlacementError", "Placement", "Problem", "Stage",
    "compare", "devices_from_config", "format_comparison", "plan", "probe_speed", "profile_blocks",
]
