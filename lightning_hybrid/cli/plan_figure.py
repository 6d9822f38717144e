"""The figure of ``lightning-hybrid plan figure=PATH``: each method's stages, and a pipeline's first steps.

Left, one bar per placement method: its stages side by side, each as long as its time per step on
its device, the bottleneck (the slowest stage, which sets the pipeline's throughput) marked. Right,
the first steps of the best placement's pipeline as a timeline: each stage's forward and backward
passes of every micro-batch under a schedule of :mod:`lightning_hybrid.pipeline.schedules`, timed
by :func:`timeline` (a stage's step time split over its micro-batches, a third forward and two
thirds backward, as for a typical network).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lightning_hybrid.devices import Device
from lightning_hybrid.pipeline.schedules import SCHEDULES, Action, Kind
from lightning_hybrid.placement.problem import InfeasiblePlacementError, Placement

#: Of a stage's time per micro-batch, the forward pass's share (the backward pass takes the rest).
FORWARD_SHARE = 1 / 3


def timeline(stage_times: Sequence[float], micro_batches: int, schedule: str = "1F1B",
             steps: int = 1) -> list[list[tuple[Action, float, float]]]:
    """When each stage runs each of its actions: per stage, ``(action, start, end)`` in order.

    A forward pass of micro-batch ``m`` on stage ``s`` starts when stage ``s - 1`` has finished
    it and stage ``s`` is free; a backward pass when stage ``s + 1`` has finished its backward
    pass of ``m``. ``steps`` optimizer steps run one after another (the next step's first forward
    waits for the stage to be free).

        >>> [[(str(a), s, e) for a, s, e in stage] for stage in timeline([3.0, 3.0], 1, "GPipe")]
        [[('F0', 0.0, 1.0), ('B0', 4.0, 6.0)], [('F0', 1.0, 2.0), ('B0', 2.0, 4.0)]]
    """
    stages = len(stage_times)
    forward = [t / micro_batches * FORWARD_SHARE for t in stage_times]
    backward = [t / micro_batches * (1 - FORWARD_SHARE) for t in stage_times]
    order = [[action for _ in range(steps) for action in SCHEDULES[schedule](s, stages, micro_batches)]
             for s in range(stages)]
    done: dict[tuple[int, int, Kind, int], float] = {}  # (step, stage, kind, micro-batch) -> end
    free = [0.0] * stages
    position = [0] * stages
    seen = [dict.fromkeys(Kind, 0) for _ in range(stages)]  # actions of each kind taken: for the step number
    result: list[list[tuple[Action, float, float]]] = [[] for _ in range(stages)]
    while any(position[s] < len(order[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            if position[s] == len(order[s]):
                continue
            action = order[s][position[s]]
            step = seen[s][action.kind] // micro_batches
            if action.kind is Kind.FORWARD:
                ready = 0.0 if s == 0 else done.get((step, s - 1, Kind.FORWARD, action.micro_batch))
                duration = forward[s]
            else:
                ready = (done.get((step, s, Kind.FORWARD, action.micro_batch)) if s == stages - 1
                         else done.get((step, s + 1, Kind.BACKWARD, action.micro_batch)))
                duration = backward[s]
            if ready is None:
                continue
            start = max(ready, free[s])
            free[s] = start + duration
            done[step, s, action.kind, action.micro_batch] = free[s]
            result[s].append((action, start, free[s]))
            seen[s][action.kind] += 1
            position[s] += 1
            progressed = True
        if not progressed:
            raise ValueError(f"the {schedule} schedule deadlocks on {stages} stages")
    return result


def draw(path: Path, devices: Sequence[Device], results: dict[str, Placement | InfeasiblePlacementError],
         micro_batches: int = 4, schedule: str = "1F1B", steps: int = 2) -> None:
    """Write the figure (see the module docstring) to ``path`` (matplotlib: the ``plots`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    placed = {m: r for m, r in results.items() if isinstance(r, Placement)}
    if not placed:
        raise ValueError("no method found a feasible placement: nothing to draw")
    best_method = min(placed, key=lambda m: placed[m].bottleneck)
    best = placed[best_method]
    colours = plt.get_cmap("tab10")
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 1.2 + 0.6 * max(len(placed), len(best.stages))),
                                         layout="constrained")
    for row, (method, placement) in enumerate(placed.items()):
        offset = 0.0
        for stage in placement.stages:
            bottleneck = stage.time_s == placement.bottleneck
            left.barh(row, stage.time_s, left=offset, color=colours(stage.device % 10),
                      edgecolor="black" if bottleneck else "white", linewidth=2 if bottleneck else 0.5)
            left.text(offset + stage.time_s / 2, row, f"{devices[stage.device].name}\n{stage.stop - stage.start} blocks",
                      ha="center", va="center", fontsize=7)
            offset += stage.time_s
    left.set_yticks(range(len(placed)), [f"{m}\n(bottleneck {p.bottleneck:.3g} s)" for m, p in placed.items()])
    left.invert_yaxis()
    left.set_xlabel("stage times, side by side (s per step); black edge: the bottleneck")
    left.set_title("placements")
    for s, actions in enumerate(timeline([st.time_s for st in best.stages], micro_batches, schedule, steps)):
        for action, start, end in actions:
            forward = action.kind is Kind.FORWARD
            right.barh(s, end - start, left=start, color=colours(best.stages[s].device % 10),
                       alpha=1.0 if forward else 0.55, edgecolor="white", linewidth=0.5)
            right.text((start + end) / 2, s, str(action), ha="center", va="center", fontsize=6)
    right.set_yticks(range(len(best.stages)), [f"stage {s}: {devices[st.device].name}" for s, st in enumerate(best.stages)])
    right.invert_yaxis()
    right.set_xlabel(f"time (s): {steps} steps of {micro_batches} micro-batches, F forward, B backward (lighter)")
    right.set_title(f"{schedule} schedule of the best placement ({best_method})")
    figure.savefig(path, dpi=110)
    plt.close(figure)
