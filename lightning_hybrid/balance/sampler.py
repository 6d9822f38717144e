"""The batch sampler of throughput-balanced data parallelism: each rank's slice of every global batch.

Epoch ``e`` shuffles the dataset with the permutation seeded by ``seed + e`` (the order
:class:`torch.utils.data.DistributedSampler` and ``EpochSeededRandomSampler`` draw), global batch
``k`` is positions ``[k * B, (k + 1) * B)`` of it, and rank ``r`` takes the part of it that the
shares in force at ``(e, k)`` give it: the samples after the shares of ranks ``0..r-1``. So every
sample is used once per epoch, and the ranks together see exactly the batches one process with
batch ``B`` and the same permutation sees, whatever the shares. The last, incomplete global batch is
split in proportion to the shares in force; it is dropped with ``drop_last``, or when it has fewer
samples than there are ranks (:attr:`BalancedBatchSampler.dropped`).

Each batch the sampler deals is noted in :attr:`BalancedBatchSampler.dealt` (first in, first out:
the DataLoader hands batches over in the order it drew them), so that whoever trains on it knows its
share of the global batch, and in the schedule's frontier.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
from torch.utils.data import Sampler

from lightning_hybrid.balance.schedule import ShareSchedule
from lightning_hybrid.balance.shares import apportion


class Dealt(NamedTuple):
    """One batch dealt to this rank: its step, this rank's samples and the global batch's."""

    epoch: int
    step: int
    samples: int
    global_samples: int


class BalancedBatchSampler(Sampler[list[int]]):
    """Yields this rank's list of sample indices for each step of an epoch.

    Args:
        num_samples: the dataset's length.
        rank: this process's rank (``0 .. schedule.world_size - 1``).
        schedule: the shares in force at each step (the strategy changes it while the epoch runs).
        seed: epoch ``e`` uses the permutation seeded by ``seed + e``.
        drop_last: drop the last incomplete global batch.
        shuffle: ``False``: the dataset's order, every epoch.
        epoch_fn: returns the epoch when an iteration starts; without it, the value of :meth:`set_epoch`.
        min_share: the fewest samples a rank gets of the last incomplete batch (when it has enough).

    Example::

        >>> schedule = ShareSchedule([1, 3])
        >>> [list(BalancedBatchSampler(8, rank, schedule, shuffle=False)) for rank in (0, 1)]
        [[[0], [4]], [[1, 2, 3], [5, 6, 7]]]
    """

    def __init__(
        self,
        num_samples: int,
        rank: int,
        schedule: ShareSchedule,
        seed: int = 0,
        drop_last: bool = False,
        shuffle: bool = True,
        epoch_fn: Callable[[], int] | None = None,
        min_share: int = 1,
    ) -> None:
        if not 0 <= rank < schedule.world_size:
            raise ValueError(f"rank {rank} is not one of the schedule's {schedule.world_size} ranks")
        self.num_samples, self.rank, self.schedule = int(num_samples), rank, schedule
        self.seed, self.drop_last, self.shuffle = int(seed), bool(drop_last), bool(shuffle)
        self.epoch_fn, self.min_share = epoch_fn, min_share
        self.epoch = 0
        #: Batches dealt and not yet taken by the trainer, oldest first.
        self.dealt: deque[Dealt] = deque()
        batch, ranks = schedule.global_batch, schedule.world_size
        self._full, tail = divmod(self.num_samples, batch)
        keep_tail = tail and not self.drop_last and tail >= ranks
        self._steps = self._full + (1 if keep_tail else 0)
        #: Samples of the last incomplete global batch left out of every epoch (drop_last, or fewer than the ranks).
        self.dropped = 0 if keep_tail else tail

    @property
    def global_batch(self) -> int:
        return self.schedule.global_batch

    def __len__(self) -> int:
        return self._steps

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self, epoch: int) -> list[int]:
        """The epoch's permutation of the dataset."""
        if not self.shuffle:
            return list(range(self.num_samples))
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.num_samples, generator=generator).tolist()

    def shares(self, epoch: int, step: int) -> tuple[int, ...]:
        """Every rank's samples of global batch ``step`` (the schedule's shares; for the last, incomplete
        batch, its samples split in proportion to them)."""
        shares = self.schedule.shares_at(epoch, step)
        if step < self._full:
            return shares
        tail = self.num_samples - self._full * self.global_batch
        least = max(1, min(self.min_share, tail // len(shares)))
        return tuple(apportion(tail, shares, least))

    def slices(self, epoch: int, order: list[int] | None = None) -> Iterator[list[list[int]]]:
        """Every rank's indices, step by step: what the ranks' samplers deal in ``epoch`` if the
        schedule does not change meanwhile (for checks; training iterates the sampler)."""
        order = self.order(epoch) if order is None else order
        for step in range(self._steps):
            start, parts = step * self.global_batch, []
            for share in self.shares(epoch, step):
                parts.append(order[start : start + share])
                start += share
            yield parts

    def __iter__(self) -> Iterator[list[int]]:
        epoch = self.epoch_fn() if self.epoch_fn is not None else self.epoch
        self.dealt.clear()  # a new pass: batches the last one drew ahead will not be trained on
        return self._deal(epoch)

    def _deal(self, epoch: int) -> Iterator[list[int]]:
        order = self.order(epoch)
        for step in range(self._steps):
            shares = self.shares(epoch, step)
            self.schedule.dealt(epoch, step)
            start = step * self.global_batch + sum(shares[: self.rank])
            self.dealt.append(Dealt(epoch, step, shares[self.rank], sum(shares)))
            yield order[start : start + shares[self.rank]]
