# Generated from lightning_hybrid/strategies/even_batches.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""Strategy glue: ranks whose exchanges run in the background train the same number of batches between sync
points, or the fit ends with one message naming each rank's count and the fix.

Two checks, both before any collective could meet the wrong partner: at each training epoch's start the
ranks compare the number of batches their loaders will give (``trainer.num_training_batches``, where known:
one all-gather), and at each sync point, before its collectives, the batches each rank took
(:class:`~lightning_hybrid.comm.batch_counts.BatchCounts`, on the run's store; it also ends the wait of a
rank whose peer's data ran out, through the exchange's ``while_waiting``).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_hybrid.comm.batch_counts import BatchCounts, UnevenBatchesError
from lightning_hybrid.comm.board import Board
from lightning_hybrid.comm.collectives import all_gather

#: What to change, said with every uneven count.
FIX = ("use Lightning's distributed sampler (use_distributed_sampler=True, the default, over a map-style dataset), "
       "give an IterableDataset the same number of batches on every rank, or cap the batches with limit_train_batches")

_FITS = itertools.count()


class EvenBatches:
    """The two checks of one fit (see the module docstring) for a strategy named ``name``."""

    def __init__(self, name: str, rank: int, world_size: int, timeout_s: float) -> None:
        self.name = name
        board = Board(f"lightning_hybrid/batches/{next(_FITS)}/", timeout_s=timeout_s)
        self.counts = BatchCounts(rank, world_size, board, timeout_s, fix=FIX)

    def check_lengths(self, trainer: pl.Trainer) -> None:
        """At a training epoch's start (every rank): :func:`refuse_uneven_loaders`."""
        refuse_uneven_loaders(self.name, trainer)

    def on_batch(self) -> None:
        self.counts.count()

    def agree(self) -> None:
        """At a sync point, before its collectives."""
        try:
            self.counts.agree()
        except UnevenBatchesError as err:
            raise UnevenBatchesError(f"{self.name}: {err}") from None

    def finish(self) -> None:
        """At the fit's end, after its last sync point (every rank): :meth:`BatchCounts.finish`."""
        self.counts.finish()

    def while_waiting(self) -> None:
        """While an exchange is waited for (about every second)."""
        try:
            self.counts.check_peers()
        except UnevenBatchesError as err:
            raise UnevenBatchesError(f"{self.name}: {err}") from None


def refuse_uneven_loaders(name: str, trainer: pl.Trainer) -> None:
    """At a training epoch's start (every rank; one all-gather): refuse loaders that give the ranks different
    numbers of batches, where every rank knows its number."""
    batches = trainer.num_training_batches
    mine = int(batches) if isinstance(batches, int) or (isinstance(batches, float) and math.isfinite(batches)) else -1
    counts = [int(c.item()) for c in all_gather(torch.tensor([mine], dtype=torch.int64))]
    if min(counts) >= 0 and len(set(counts)) > 1:
        said = ", ".join(f"rank {r}: {c}" for r, c in enumerate(counts))
        raise UnevenBatchesError(f"{name}: the ranks' training loaders give different numbers of batches an epoch "
                                 f"({said}); every rank must train the same number: {FIX}")


def even_batches(strategy: Any) -> EvenBatches:
    """The checks for ``strategy``'s fit (its name, rank, world size and process-group timeout)."""
    timeout = getattr(strategy, "_timeout", None)
    timeout_s = timeout.total_seconds() if timeout is not None else 1800.0
    return EvenBatches(type(strategy).__name__, strategy.global_rank, strategy.world_size, timeout_s)
