"""``plan(blocks, devices, method=...)``: place a block sequence on devices, and compare methods."""

from __future__ import annotations

from collections.abc import Sequence

from lightning_hybrid.devices import Device
from lightning_hybrid.placement.gabra import GABRA
from lightning_hybrid.placement.headroom import keep_headroom
from lightning_hybrid.placement.problem import Block, InfeasiblePlacementError, Placement, Problem
from lightning_hybrid.placement.solvers import balance_by_time, exact, parameters, uniform

METHODS = ("gabra", "exact", "uniform", "parameters", "time")


def plan(
    blocks: Sequence[Block],
    devices: Sequence[Device],
    method: str = "gabra",
    objective: str = "bottleneck",
    stages: int | None = None,
    seed: int = 0,
    held_messages: int = 0,
    memory_headroom: float = 0.1,
    **gabra_options,
) -> Placement:
    """Cut ``blocks`` into contiguous stages and give each stage its own device.

    Args:
        blocks: the model's blocks in pipeline order (:func:`~lightning_hybrid.placement.profile_blocks`).
        devices: the devices (:class:`Device`: speed, memory, bandwidth).
        method: ``"gabra"`` (paper 003's genetic algorithm), ``"exact"`` (optimal, dynamic
            programming), ``"uniform"`` (as many blocks per stage), ``"parameters"`` (balanced
            parameter counts, DeepSpeed's default) or ``"time"`` (balanced measured time,
            torchgpipe's ``balance_by_time``).
        objective: GABRA's fitness: ``"bottleneck"`` (the largest stage time, which sets pipeline
            throughput) or ``"paper"`` (paper 003's knapsack profit, for fidelity).
        stages: number of pipeline stages; default one per device.
        seed: GABRA's random seed.
        held_messages: copies of its input and output a stage keeps for its messages at once, counted in
            its memory (:class:`Problem`; the pipeline's micro-batches a step).
        memory_headroom: the fraction of each device's memory a ``"gabra"`` or ``"exact"`` placement for the
            bottleneck leaves free where it can (:func:`~lightning_hybrid.placement.headroom.keep_headroom`):
            when the fastest placement fills a device beyond ``1 - memory_headroom`` (memory binds), the
            fastest that leaves it free, else the one whose fullest device is least full; 0 turns it off.
        gabra_options: further :class:`~lightning_hybrid.placement.gabra.GABRA` arguments
            (``population``, ``t_max``, ``crossover_prob``, ``mutation_prob``, ``balance_cuts``).

    Raises:
        InfeasiblePlacementError: more stages than blocks, or the devices' memory cannot hold the
            model (or this method's placement of it).

    Example::

        >>> from lightning_hybrid.placement import Block, Device, plan
        >>> blocks = [Block(f"b{i}", cost=c) for i, c in enumerate([4, 1, 1, 2, 2, 2])]
        >>> devices = [Device("slow", speed=1.0), Device("fast", speed=2.0)]
        >>> p = plan(blocks, devices, method="exact")
        >>> p.device_order, p.boundaries, p.bottleneck
        ([1, 0], [(0, 4), (4, 6)], 4.0)
    """
    if method not in METHODS:
        raise ValueError(f"unknown placement method {method!r}; choose one of {', '.join(METHODS)}")
    if objective not in ("bottleneck", "paper"):
        raise ValueError(f"objective must be 'bottleneck' or 'paper', got {objective!r}")
    problem = Problem(blocks, devices, stages, held_messages=held_messages)
    if method == "gabra":
        def solve(p: Problem) -> Placement:
            return GABRA(p, objective=objective, seed=seed, **gabra_options).run()

        placement = solve(problem)
        if not placement.feasible or placement.fitness == 0.0:
            why = "fits their memory" if objective == "bottleneck" else "fits their memory and capacities (eq. 6)"
            raise InfeasiblePlacementError(
                f"GABRA found no placement of the {problem.n} blocks on {problem.k} devices that {why} in "
                f"{placement.generations} generations; add memory or devices, or shrink the model or batch"
            )
    else:
        solve = {"exact": exact, "uniform": uniform, "parameters": parameters, "time": balance_by_time}[method]
        placement = solve(problem)
    if method in ("gabra", "exact") and objective == "bottleneck" and memory_headroom:
        placement = keep_headroom(problem, placement, memory_headroom, solve)
    return placement


def compare(
    blocks: Sequence[Block], devices: Sequence[Device], methods: Sequence[str] = METHODS, **options
) -> dict[str, Placement | InfeasiblePlacementError]:
    """Each method's placement (or why it has none), for side-by-side tables."""
    results: dict[str, Placement | InfeasiblePlacementError] = {}
    for method in methods:
        try:
            results[method] = plan(blocks, devices, method=method, **options)
        except InfeasiblePlacementError as error:
            results[method] = error
    return results


def format_comparison(
    blocks: Sequence[Block], devices: Sequence[Device], results: dict[str, Placement | InfeasiblePlacementError]
) -> str:
    """A markdown table: per method, each stage's device, blocks and time, and the bottleneck."""
    finite = [r.bottleneck for r in results.values() if isinstance(r, Placement)]
    best = min(finite) if finite else None
    lines = ["| method | stages (device: blocks, time) | bottleneck | vs best | solver time |", "|---|---|---|---|---|"]
    for method, result in results.items():
        if isinstance(result, InfeasiblePlacementError):
            lines.append(f"| {method} | infeasible: {result} | | | |")
            continue
        stages = "; ".join(
            f"{devices[s.device].name}: {blocks[s.start].name}..{blocks[s.stop - 1].name} "
            f"({s.stop - s.start}) {s.time_s:.4g} s"
            for s in result.stages
        )
        ratio = f"{result.bottleneck / best:.3f}x" if best else ""
        lines.append(f"| {method} | {stages} | {result.bottleneck:.4g} s | {ratio} | {result.seconds * 1e3:.1f} ms |")
    return "\n".join(lines)
