# Generated from lightning_hybrid/cli/plan_figure.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""The figure of ``lightning-hybrid plan figure=PATH``: each method's stages, and the best one's pipeline.

Drawn by :func:`lightning_hybrid.placement.figure.placement_figure`, which also draws the figure
HybridParallelStrategy logs to TensorBoard (its one placement); here its left panel has a row per
placement method, the method's stages side by side, each as long as its time per step on its device,
the bottleneck marked; right, the first steps of the best placement's pipeline as a timeline of its
schedule's actions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lightning_hybrid.devices import Device
from lightning_hybrid.placement.figure import placement_figure
from lightning_hybrid.placement.problem import InfeasiblePlacementError, Placement


def draw(path: Path, devices: Sequence[Device], results: dict[str, Placement | InfeasiblePlacementError],
         micro_batches: int = 4, schedule: str = "1F1B", steps: int = 2,
         block_names: Sequence[str] | None = None) -> None:
    """Write the figure (see the module docstring) to ``path`` (matplotlib: the ``plots`` extra)."""
    placed = {m: r for m, r in results.items() if isinstance(r, Placement)}
    if not placed:
        raise ValueError("no method found a feasible placement: nothing to draw")
    best = min(placed.values(), key=lambda p: p.bottleneck)
    figure = placement_figure(best, devices, block_names, micro_batches=micro_batches, schedule=schedule,
                              steps=steps, others=placed)
    figure.savefig(path, dpi=110)
