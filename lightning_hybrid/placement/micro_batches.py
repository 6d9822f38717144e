"""How many micro-batches a pipeline splits its batch into: the count whose predicted step is shortest.

A step of ``S`` stages over ``M`` micro-batches (1F1B or GPipe) takes about ``(M + S - 1)`` times its slowest
stage's time for one micro-batch: more micro-batches shrink the bubble (``S - 1`` of them idle) but each is
smaller, and a small micro-batch costs more per sample where the kernels need a batch to run well (on CPUs,
3D-ResAttNet-18 at 48^3 took 280 ms a sample at a batch of 1, 190 at 2, 164 at 4, 137 at 8:
``benchmarks/hybrid_vs_data_parallel.py --micro-batch-cost``). So :func:`choose_micro_batches` places the
model once for each count of :func:`micro_batch_candidates`, the blocks timed at that count's micro-batch,
and keeps the count whose ``(M + S - 1) x bottleneck`` is least. On FLOPs alone (which grow with the
micro-batch in proportion) that is the most micro-batches tried, unless fewer are predicted within
:data:`CLOSE` of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lightning_hybrid.placement.problem import InfeasiblePlacementError, Placement

#: Counts predicted within this fraction of the shortest step count as tied, and the fewest of them is chosen:
#: each micro-batch costs every stage a message pair and a turn of its schedule that the prediction leaves out
#: (on CPU ranks, ResAttNet-18 at 48^3: a count of 4 predicted 0.5 % and 2.1 % shorter than 2 ran slower than
#: every run that chose 2, 4.0 s an epoch against 2.8-3.6 and 105 ms a sample against 85-91).
CLOSE = 0.05

#: The most micro-batches :func:`micro_batch_candidates` tries, in stages: at ``4 S`` the bubble is under 20 %
#: of a step (GPipe's advice), and more only makes the micro-batches smaller.
MOST_PER_STAGE = 4


def micro_batch_candidates(batch: int, stages: int) -> list[int]:
    """The counts worth trying for a batch of ``batch`` samples and ``stages`` stages: the batch's divisors from
    ``stages`` (1F1B needs one a stage; fewer leaves stages idle) to ``4 x stages``; where none is, the least
    divisor above ``stages``; where the batch is smaller than ``stages``, the batch (a sample a micro-batch)."""
    if batch < 1 or stages < 1:
        raise ValueError(f"batch and stages must be positive, got batch={batch}, stages={stages}")
    if batch <= stages:
        return [batch]
    counts = [m for m in range(stages, min(batch, MOST_PER_STAGE * stages) + 1) if batch % m == 0]
    return counts or [next(m for m in range(stages, batch + 1) if batch % m == 0)]


def predicted_step(placement: Placement, micro_batches: int) -> float:
    """Seconds a step of ``micro_batches`` takes on ``placement`` (its bottleneck for one micro-batch): the
    pipeline fills in ``S - 1`` micro-batch times, then moves one micro-batch a bottleneck."""
    return (micro_batches + len(placement.stages) - 1) * placement.bottleneck


def choose_micro_batches(plan_for: Callable[[int], Placement], counts: Sequence[int]) -> Placement:
    """``plan_for(M)``'s placement (the blocks profiled on a micro-batch of ``batch / M``) for the ``M`` of
    ``counts`` with the least :func:`predicted_step` (the fewest of those within :data:`CLOSE` of it); its ``notes["micro_batches"]`` is that ``M`` and
    ``notes["predicted_step_s"]`` each count's prediction (a count no placement fits is left out; if none
    fits, the last count's error is raised)."""
    if not counts:
        raise ValueError("no micro-batch counts to choose from")
    predicted: dict[int, float] = {}
    placements: dict[int, Placement] = {}
    error: InfeasiblePlacementError | None = None
    for m in counts:
        try:
            placements[m] = plan_for(m)
        except InfeasiblePlacementError as refused:
            error = refused
            continue
        predicted[m] = predicted_step(placements[m], m)
    if not placements:
        assert error is not None
        raise error
    shortest = min(predicted.values())
    chosen = min(m for m in predicted if predicted[m] <= shortest * (1 + CLOSE))
    best = placements[chosen]
    best.notes["micro_batches"] = chosen
    best.notes["predicted_step_s"] = predicted
    return best
