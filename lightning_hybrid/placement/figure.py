"""A placement's figure and its numbers as text: which stage holds which blocks on which device, and
its pipeline's first steps.

:func:`placement_figure` draws one placement (matplotlib, the ``plots`` extra). Left, its stages
side by side, each bar as long as the stage's predicted time on its device and labelled with the
device, the blocks and the ranks; the bottleneck (the slowest stage, which sets the pipeline's
throughput) has a black edge. Given ``others`` (each method's placement, as ``lightning-hybrid plan``
compares them), the left panel has a row per method instead. Right, the placement's pipeline as a
timeline: each stage's forward and backward passes of every micro-batch under a schedule of
:mod:`lightning_hybrid.pipeline.schedules`, timed by :func:`timeline` (a stage's step time split over
its micro-batches, a third forward and two thirds backward, as for a typical network).
:func:`format_placement` gives the same numbers as a markdown table, :func:`placement_summary` on one line.

``lightning-hybrid plan figure=PATH`` (:mod:`lightning_hybrid.cli.plan_figure`) and
:class:`~lightning_hybrid.HybridParallelStrategy` (into a TensorBoard logger) both draw with
:func:`placement_figure`. It builds a :class:`matplotlib.figure.Figure` on an Agg canvas without
pyplot, so it neither needs a display nor changes the process's matplotlib backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from lightning_hybrid.devices import Device
from lightning_hybrid.pipeline.schedules import SCHEDULES, Action, Kind
from lightning_hybrid.placement.problem import Placement

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Of a stage's time per micro-batch, the forward pass's share (the backward pass takes the rest).
FORWARD_SHARE = 1 / 3
#: What a placement's stage times are per: a whole step (``lightning-hybrid plan``: blocks profiled
#: on the batch) or one micro-batch (the strategy profiles one micro-batch of the first batch).
TIME_UNITS = ("step", "micro-batch")


def timeline(stage_times: Sequence[float], micro_batches: int, schedule: str = "1F1B",
             steps: int = 1) -> list[list[tuple[Action, float, float]]]:
    """When each stage runs each of its actions: per stage, ``(action, start, end)`` in order.

    ``stage_times`` are each stage's time per step (all its micro-batches). A forward pass of
    micro-batch ``m`` on stage ``s`` starts when stage ``s - 1`` has finished it and stage ``s`` is
    free; a backward pass when stage ``s + 1`` has finished its backward pass of ``m``. ``steps``
    optimizer steps run one after another (the next step's first forward waits for the stage to be free).

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


def _blocks(placement: Placement, s: int, block_names: Sequence[str] | None) -> str:
    stage = placement.stages[s]
    count = f"{stage.stop - stage.start} block{'s' if stage.stop - stage.start > 1 else ''}"
    first, last = (stage.start, stage.stop - 1) if block_names is None else (block_names[stage.start], block_names[stage.stop - 1])
    return f"{'blocks ' if block_names is None else ''}{first}{'' if first == last else f'..{last}'} ({count})"


def _ranks(ranks: Sequence[Sequence[int]] | None, s: int) -> str:
    if ranks is None:
        return ""
    return f"rank{'s' if len(ranks[s]) > 1 else ''} {','.join(str(r) for r in ranks[s])}"


def _check(placement: Placement, devices: Sequence[Device], block_names: Sequence[str] | None,
           ranks: Sequence[Sequence[int]] | None, time_unit: str) -> None:
    if time_unit not in TIME_UNITS:
        raise ValueError(f"time_unit must be one of {', '.join(TIME_UNITS)}, got {time_unit!r}")
    if max(stage.device for stage in placement.stages) >= len(devices):
        raise ValueError(f"the placement uses device {max(placement.device_order)} but {len(devices)} devices are given")
    if block_names is not None and max(stage.stop for stage in placement.stages) > len(block_names):
        raise ValueError(f"the placement cuts {placement.stages[-1].stop} blocks but {len(block_names)} names are given")
    if ranks is not None and len(ranks) != len(placement.stages):
        raise ValueError(f"ranks names {len(ranks)} stages, the placement has {len(placement.stages)}")


def format_placement(placement: Placement, devices: Sequence[Device], block_names: Sequence[str] | None = None,
                     ranks: Sequence[Sequence[int]] | None = None, time_unit: str = "step") -> str:
    """The placement's numbers as markdown: a line on the whole, then a row per stage (device, ranks,
    blocks, predicted compute, transfer and total time, memory, the device's speed; the bottleneck marked).

        >>> from lightning_hybrid.placement import Block, plan
        >>> blocks = [Block(f"b{i}", cost=c) for i, c in enumerate([4, 1, 1, 2, 2, 2])]
        >>> devices = [Device("slow", speed=1.0), Device("fast", speed=2.0)]
        >>> print(format_placement(plan(blocks, devices, method="exact"), devices).splitlines()[4])
        | 0 | fast |  | blocks 0..3 (4 blocks) | 4 | 0 | 4 | 0 | 2 | bottleneck |
    """
    _check(placement, devices, block_names, ranks, time_unit)
    slowest = [s for s, stage in enumerate(placement.stages) if stage.time_s == placement.bottleneck]
    lines = [
        f"**{placement.method}** placement ({placement.objective} objective, solved in {placement.seconds:.3g} s): "
        f"{len(placement.stages)} stages, predicted bottleneck {placement.bottleneck:.4g} s per {time_unit} "
        f"(stage{'s' if len(slowest) > 1 else ''} {', '.join(map(str, slowest))}){'' if placement.feasible else '; does NOT fit the devices memory'}",
        "",
        "| stage | device | ranks | blocks | compute (s) | transfer (s) | time (s) | memory (MiB) | device speed | |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s, stage in enumerate(placement.stages):
        lines.append(
            f"| {s} | {devices[stage.device].name} | {', '.join(map(str, ranks[s])) if ranks else ''} | "
            f"{_blocks(placement, s, block_names)} | {stage.compute_s:.4g} | {stage.transfer_s:.4g} | "
            f"{stage.time_s:.4g} | {stage.memory / 2**20:.4g} | {devices[stage.device].speed:.4g} | "
            f"{'bottleneck' if s in slowest else ''} |"
        )
    return "\n".join(lines)


def placement_summary(placement: Placement, devices: Sequence[Device], block_names: Sequence[str],
                      ranks: Sequence[int]) -> str:
    """The placement on one line (what :class:`~lightning_hybrid.HybridParallelStrategy` logs): its method,
    predicted bottleneck and solving time, then each stage's blocks, rank (``ranks[s]``), device,
    predicted time and memory; times per micro-batch, the strategy's profiling unit."""
    stages = "; ".join(
        f"stage {s}: {block_names[st.start]}..{block_names[st.stop - 1]} on rank {ranks[s]} "
        f"({devices[st.device].name}, {st.time_s:.4g} s, {st.memory / 2**20:.0f} MiB)"
        for s, st in enumerate(placement.stages)
    )
    memory = f"; memory: {placement.notes['memory']}" if "memory" in placement.notes else ""
    predicted = placement.notes.get("predicted_step_s", {})
    if len(predicted) > 1:  # the micro-batch count was chosen (micro_batches="auto")
        memory += (f"; {placement.notes['micro_batches']} micro-batches a step, predicted shortest ("
                   + ", ".join(f"{m}: {s:.3g} s" for m, s in predicted.items()) + ")")
    return (f"{placement.method} placement, predicted bottleneck {placement.bottleneck:.4g} (block cost / device speed "
            f"per micro-batch), solved in {placement.seconds:.3f} s: {stages}{memory}")


def placement_figure(
    placement: Placement,
    devices: Sequence[Device],
    block_names: Sequence[str] | None = None,
    ranks: Sequence[Sequence[int]] | None = None,
    micro_batches: int = 4,
    schedule: str = "1F1B",
    steps: int = 2,
    time_unit: str = "step",
    others: Mapping[str, Placement] | None = None,
) -> Figure:
    """The figure of one placement (see the module docstring); matplotlib, the ``plots`` extra.

    Args:
        placement: the placement drawn, and whose pipeline the timeline shows.
        devices: the devices its stages' ``device`` indices name.
        block_names: the blocks' names (labels say ``blocks i..j`` without them).
        ranks: per stage, the ranks that run it (one per data-parallel replica), or ``None``.
        micro_batches, schedule, steps: the timeline's pipeline (``schedule`` of
            :data:`~lightning_hybrid.pipeline.schedules.SCHEDULES`).
        time_unit: ``"step"`` when the stage times are per step, ``"micro-batch"`` when per
            micro-batch (the timeline then runs ``micro_batches`` of them per step).
        others: placements to draw side by side in the left panel, one row each, by name
            (``placement`` among them); only ``placement`` by default.

    Raises:
        ImportError: matplotlib is not installed (``pip install "lightning-hybrid[plots]"``).
    """
    _check(placement, devices, block_names, ranks, time_unit)
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = dict(others) if others else {placement.method: placement}
    single = len(rows) == 1
    colours = matplotlib.colormaps["tab10"]
    height = max(2.4 if single else len(rows) * 0.8, len(placement.stages) * 0.7)
    figure = Figure(figsize=(13, 1.6 + height), layout="constrained")
    FigureCanvasAgg(figure)  # renders to images and files, whatever pyplot's backend is
    left, right = figure.subplots(1, 2)
    widest = max(sum(stage.time_s for stage in drawn.stages) for drawn in rows.values())
    for row, (name, drawn) in enumerate(rows.items()):
        offset = 0.0
        for s, stage in enumerate(drawn.stages):
            bottleneck = stage.time_s == drawn.bottleneck
            left.barh(row, stage.time_s, left=offset, color=colours(stage.device % 10),
                      edgecolor="black" if bottleneck else "white", linewidth=2.5 if bottleneck else 0.5)
            if single:  # room for everything: blocks, device, ranks, time
                label = "\n".join(filter(None, (
                    f"stage {s}: {devices[stage.device].name}", _ranks(ranks, s), _blocks(drawn, s, block_names),
                    f"{stage.time_s:.3g} s" + (" (bottleneck)" if bottleneck else ""))))
            else:
                label = f"{devices[stage.device].name}\n{stage.stop - stage.start} blocks"
            if single or stage.time_s >= 0.06 * widest:  # a label wider than its segment would overlap the next
                left.text(offset + stage.time_s / 2, row, label, ha="center", va="center", fontsize=8 if single else 7)
            offset += stage.time_s
    left.set_yticks(range(len(rows)), [f"{m}\n(bottleneck {p.bottleneck:.3g} s)" for m, p in rows.items()])
    left.invert_yaxis()
    left.set_xlabel(f"stage times, side by side (s per {time_unit})\nblack edge: the bottleneck")
    left.set_title("placements" if not single else f"{placement.method} placement: {len(placement.stages)} stages")
    per_step = micro_batches if time_unit == "micro-batch" else 1
    runs = timeline([st.time_s * per_step for st in placement.stages], micro_batches, schedule, steps)
    for s, actions in enumerate(runs):
        for action, start, end in actions:
            forward = action.kind is Kind.FORWARD
            right.barh(s, end - start, left=start, color=colours(placement.stages[s].device % 10),
                       alpha=1.0 if forward else 0.55, edgecolor="white", linewidth=0.5)
            right.text((start + end) / 2, s, str(action), ha="center", va="center", fontsize=6)
    right.set_yticks(range(len(placement.stages)), [
        ", ".join(filter(None, (f"stage {s}: {devices[st.device].name}", _ranks(ranks, s))))
        for s, st in enumerate(placement.stages)
    ])
    right.invert_yaxis()
    right.set_xlabel(f"time (s): {steps} steps of {micro_batches} micro-batches\nF forward, B backward (lighter)")
    right.set_title(f"{schedule} schedule of the {placement.method} placement")
    return figure
