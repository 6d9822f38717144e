"""A parameter-server worker's figures for one epoch: counted during it, summarised at its end, gathered
from every worker (plain torch; the strategy logs them as ``<prefix>/worker{rank}/...``).

* :func:`new_counts` is the running tally a worker adds to between sync points (``iterations``,
  ``samples``, ``staleness_sum``, ``staleness_max``, ``wait_s``, ``max_gap``; ``train_s`` once the
  epoch ends).
* :func:`summarise` turns the tally into :class:`WorkerEpochStats` (means and rates).
* :func:`gather_stats` collects every member's figures (one all-gather of a row of floats);
  :func:`epoch_history` is the row of one epoch by worker rank, zeros for a lost worker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields

import torch

from lightning_hybrid.comm.collectives import all_gather


@dataclass
class WorkerEpochStats:
    """One worker's figures for one epoch (logged as ``<prefix>/worker{rank}/...``)."""

    iterations: int = 0
    samples: int = 0
    staleness_mean: float = 0.0
    staleness_max: int = 0
    wait_s: float = 0.0
    train_s: float = 0.0
    max_gap: int = 0
    samples_per_s: float = 0.0


def new_counts() -> dict[str, float]:
    """A worker's tally at the start of an epoch (its subclasses add to these keys)."""
    return dict(iterations=0, samples=0, staleness_sum=0, staleness_max=0, wait_s=0.0, max_gap=0)


def summarise(counts: Mapping[str, float]) -> WorkerEpochStats:
    """The figures of an epoch's tally: the mean staleness per iteration, samples per second of training."""
    train_s = counts.get("train_s", 0.0)
    return WorkerEpochStats(
        iterations=int(counts["iterations"]), samples=int(counts["samples"]),
        staleness_mean=counts["staleness_sum"] / max(counts["iterations"], 1), staleness_max=int(counts["staleness_max"]),
        wait_s=counts["wait_s"], train_s=train_s, max_gap=int(counts["max_gap"]),
        samples_per_s=counts["samples"] / max(train_s, 1e-9),
    )


def to_row(stats: WorkerEpochStats) -> torch.Tensor:
    """``stats`` as a float64 row, in the order of the dataclass's fields."""
    return torch.tensor([float(v) for v in asdict(stats).values()], dtype=torch.float64)


def from_row(row: torch.Tensor) -> WorkerEpochStats:
    """The inverse of :func:`to_row` (integer fields back to ``int``)."""
    return WorkerEpochStats(**{f.name: type(f.default)(v) for f, v in zip(fields(WorkerEpochStats), row.tolist())})


def gather_stats(mine: WorkerEpochStats, members: Sequence[int]) -> dict[int, WorkerEpochStats]:
    """Every member's figures by its rank (a collective: every member of the default group calls it,
    ``members`` being their original ranks in group order)."""
    return {rank: from_row(row) for rank, row in zip(members, all_gather(to_row(mine)))}


def epoch_history(gathered: Mapping[int, WorkerEpochStats], workers: int) -> list[WorkerEpochStats]:
    """One epoch's figures of ranks ``0 .. workers - 1``: a lost worker's are zeros."""
    return [gathered.get(rank, WorkerEpochStats()) for rank in range(workers)]


def epoch_logs(gathered: Mapping[int, WorkerEpochStats], workers: int, names: Sequence[str], prefix: str) -> dict[str, float]:
    """What the strategy logs of one epoch: ``<prefix>/worker{rank}/<name>`` for each gathered worker
    and each of ``names``, and ``<prefix>/max_gap`` (the largest over all workers) if ``names`` has it."""
    logs = {f"{prefix}/worker{rank}/{name}": float(getattr(gathered[rank], name))
            for rank in range(workers) if rank in gathered for name in names}
    if "max_gap" in names:
        logs[f"{prefix}/max_gap"] = float(max(s.max_gap for s in epoch_history(gathered, workers)))
    return logs
