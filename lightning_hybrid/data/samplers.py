"""Samplers whose order depends only on a seed, the epoch and (for a worker's own shard) its rank: a resumed
run sees the batches one that never stopped would have seen."""

from __future__ import annotations

from collections.abc import Iterator, Sized

import torch
from torch.utils.data import Dataset, DistributedSampler, RandomSampler


class EpochSeededRandomSampler(RandomSampler):
    """A shuffling sampler whose order depends only on ``(seed, epoch)``.

    Lightning calls ``set_epoch`` at the start of every training epoch, so a run resumed from a
    checkpoint sees the same batches as one that never stopped. It is a ``RandomSampler``, so under
    a distributed strategy Lightning swaps in its ``DistributedSampler`` (seeded with the global
    seed). The permutation is the one ``DistributedSampler(seed=seed)`` draws for the same epoch, so
    one process with batch size ``k * b`` sees exactly the global batches of ``k`` DDP ranks with
    batch size ``b``: the reference the strategies' equivalence tests compare against.
    """

    def __init__(self, data_source: Sized, seed: int = 0) -> None:
        super().__init__(data_source)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        yield from torch.randperm(len(self.data_source), generator=generator).tolist()


class LocalShuffleSampler(DistributedSampler):
    """Shuffles a worker's own resident samples (seeded by seed, rank and epoch); nothing is split.

    It is a ``DistributedSampler`` (of one replica) so that Lightning does not split the worker's
    shard a second time; Lightning calls ``set_epoch`` every epoch, so a resumed run sees the same
    order as one that never stopped.
    """

    def __init__(self, dataset: Dataset, seed: int = 0, rank: int = 0) -> None:
        super().__init__(dataset, num_replicas=1, rank=0, shuffle=True, seed=seed + 1000003 * rank)
