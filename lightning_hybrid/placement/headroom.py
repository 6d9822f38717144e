"""Memory headroom: the fastest placement that leaves every device a fraction of its memory free.

A plan's memory is an estimate: the whole-brain pipeline's largest stages peaked up to 10 % above theirs
(``benchmarks/whole_brain_memory.py``: 818 MiB against 747), so a placement that fills a device to its last
percent is one that may not fit. Memory *binds* when the fastest placement fills some device
beyond ``1 - headroom``: :func:`keep_headroom` then returns the fastest placement that leaves ``headroom``
of every device's memory free, and where none does, the placement whose fullest device is least full
(then the fastest at that fill): the stages' memory is balanced before their time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from lightning_hybrid.placement.problem import InfeasiblePlacementError, Placement, Problem
from lightning_hybrid.placement.solvers import min_max_over_orders

#: What the method places a problem with: ``solve(problem) -> Placement`` (raises InfeasiblePlacementError).
Solve = Callable[[Problem], Placement]


def keep_headroom(problem: Problem, fastest: Placement, headroom: float, solve: Solve) -> Placement:
    """``fastest`` where it leaves ``headroom`` (a fraction, 0 <= headroom < 1) of every device's memory free,
    else a slower placement that does (or the least full one); its ``notes["memory"]`` says which and why."""
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"memory_headroom must be a fraction in [0, 1), got {headroom!r}")
    stage, fill = problem.fullest(fastest)
    device = problem.devices[fastest.stages[stage].device].name
    if fill <= 1.0 - headroom:
        return fastest
    binds = f"the fastest placement fills {device} to {fill:.0%} of its memory (more than {1 - headroom:.0%})"
    kept = _solve_within(problem, 1.0 - headroom, solve, fastest)
    if kept is not None:
        why = f"{binds}: placed to leave {headroom:.0%} free, at {kept.bottleneck / fastest.bottleneck:.2f}x its bottleneck"
        return _noted(kept, why)
    least, order, bounds = min_max_over_orders(problem, [problem.fill_table(d) for d in range(problem.m)])
    if not math.isfinite(least) or least >= fill:
        return _noted(fastest, f"{binds}; no placement leaves {headroom:.0%} free or fills less")
    balanced = _solve_within(problem, least * (1 + 1e-9), solve, fastest) or problem.placement(
        fastest.method, order, bounds, objective=fastest.objective)
    why = (f"{binds}; none leaves {headroom:.0%} free: placed so that the fullest device is least full "
           f"({problem.fullest(balanced)[1]:.0%}), at {balanced.bottleneck / fastest.bottleneck:.2f}x its bottleneck")
    return _noted(balanced, why)


def _solve_within(problem: Problem, fraction: float, solve: Solve, like: Placement) -> Placement | None:
    """The method's placement with each device holding ``fraction`` of its memory, on the real devices (None:
    it finds none)."""
    devices = [dataclasses.replace(d, memory=d.memory * fraction) for d in problem.devices]
    try:
        found = solve(Problem(problem.blocks, devices, problem.k, problem.held_messages))
    except InfeasiblePlacementError:
        return None
    if not found.feasible:
        return None
    return problem.placement(found.method, found.device_order, found.boundaries, seconds=like.seconds + found.seconds,
                             objective=found.objective, fitness=found.fitness, generations=found.generations)


def _noted(placement: Placement, why: str) -> Placement:
    placement.notes["memory"] = why
    return placement
