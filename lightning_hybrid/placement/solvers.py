"""Placement methods other than GABRA: the exact optimum and three common heuristics.

``exact`` is a dynamic program over (set of devices used, blocks placed): the optimal bottleneck
over every contiguous partition and every order of every ``k``-subset of the devices, in
``O(2^m * m * n^2)``; fine for the 8 devices and 40 blocks of the tests.
The heuristics ignore device speeds and keep the devices in the given order, as their tools do:
``uniform`` gives every stage the same number of blocks; ``parameters`` balances the parameter
count per stage (DeepSpeed's default ``partition_method``); ``time`` balances measured time per
block (torchgpipe's ``balance_by_time``; block cost where no time was measured).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence

import numpy as np

from lightning_hybrid.placement.problem import InfeasiblePlacementError, Placement, Problem, min_max_cuts


def exact(problem: Problem) -> Placement:
    """The placement with the smallest bottleneck (ties: the first found)."""
    start_time = time.perf_counter()
    value, order, bounds = min_max_over_orders(problem, [problem.table(d) for d in range(problem.m)])
    if not np.isfinite(value):
        raise InfeasiblePlacementError(
            f"no placement of the {problem.n} blocks on {problem.k} of the devices fits their memory; add memory or "
            "devices, or shrink the model or batch"
        )
    return problem.placement("exact", order, bounds, seconds=time.perf_counter() - start_time)


def min_max_over_orders(problem: Problem, tables: Sequence[np.ndarray]) -> tuple[float, list[int], list[tuple[int, int]]]:
    """The least largest stage cost over every contiguous partition and every order of every ``k``-subset of
    the devices, stage ``i:j`` on device ``d`` costing ``tables[d][i, j]`` (``inf``: not allowed): a dynamic
    program over (set of devices used, blocks placed). Returns ``(cost, device order, bounds)``; the cost is
    ``inf`` (and the order and bounds empty) when nothing is allowed."""
    n, m, k = problem.n, problem.m, problem.k
    best: dict[int, np.ndarray] = {0: np.concatenate([[0.0], np.full(n, np.inf)])}
    back: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for size in range(1, k + 1):
        for subset in itertools.combinations(range(m), size):
            mask = sum(1 << d for d in subset)
            values = np.full(n + 1, np.inf)
            last_device = np.full(n + 1, -1)
            last_start = np.zeros(n + 1, dtype=int)
            for d in subset:
                previous = best.get(mask & ~(1 << d))
                if previous is None:
                    continue
                candidates = np.maximum(previous[:, None], tables[d])
                arg = np.argmin(candidates, axis=0)
                value = candidates[arg, np.arange(n + 1)]
                better = value < values
                values[better], last_device[better], last_start[better] = value[better], d, arg[better]
            best[mask] = values
            back[mask] = (last_device, last_start)
    finals = {mask: v[n] for mask, v in best.items() if bin(mask).count("1") == k}
    mask = min(finals, key=finals.get)
    if not np.isfinite(finals[mask]):
        return math.inf, [], []
    cost = float(finals[mask])
    order, bounds, stop = [], [], n
    while mask:
        last_device, last_start = back[mask]
        d, start = int(last_device[stop]), int(last_start[stop])
        order.append(d)
        bounds.append((start, stop))
        mask &= ~(1 << d)
        stop = start
    return cost, order[::-1], bounds[::-1]


def _balanced_bounds(weights: Sequence[float], k: int) -> list[tuple[int, int]]:
    """Contiguous bounds of ``k`` non-empty parts minimising the largest part's weight sum."""
    n = len(weights)
    prefix = np.concatenate([[0.0], np.cumsum(weights, dtype=float)])
    i, j = np.arange(n + 1)[:, None], np.arange(n + 1)[None, :]
    table = np.where(j > i, prefix[j] - prefix[i], np.inf)
    return min_max_cuts([table] * k)[1]


def _in_given_order(problem: Problem, method: str, bounds: list[tuple[int, int]], start_time: float) -> Placement:
    placement = problem.placement(method, list(range(problem.k)), bounds, seconds=time.perf_counter() - start_time)
    if not placement.feasible:
        over = [
            f"stage {s} ({problem.blocks[st.start].name}..{problem.blocks[st.stop - 1].name}) needs "
            f"{st.memory / 2**20:.1f} MiB on {problem.devices[st.device].name} "
            f"({problem.devices[st.device].memory / 2**20:.1f} MiB)"
            for s, st in enumerate(placement.stages) if st.memory > problem.devices[st.device].memory
        ]
        raise InfeasiblePlacementError(f"the {method!r} placement does not fit: {'; '.join(over)}")
    return placement


def uniform(problem: Problem) -> Placement:
    start = time.perf_counter()
    q, r = divmod(problem.n, problem.k)
    sizes = [q + (s < r) for s in range(problem.k)]
    edges = np.concatenate([[0], np.cumsum(sizes)])
    return _in_given_order(problem, "uniform", [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])], start)


def parameters(problem: Problem) -> Placement:
    start = time.perf_counter()
    return _in_given_order(problem, "parameters", _balanced_bounds([b.params for b in problem.blocks], problem.k), start)


def balance_by_time(problem: Problem) -> Placement:
    start = time.perf_counter()
    weights = [b.time if b.time is not None else b.cost for b in problem.blocks]
    return _in_given_order(problem, "time", _balanced_bounds(weights, problem.k), start)
