"""Handing out an epoch's batches to workers on request, each sample exactly once per epoch."""

from __future__ import annotations

import math

import torch


class ChunkDispenser:
    """Deals an epoch's shuffled sample indices out in batch-sized chunks.

    The epoch's order is ``torch.randperm(num_samples)`` seeded with ``seed + epoch`` (the order
    Lightning's ``DistributedSampler`` and :class:`~lightning_hybrid.data.base.EpochSeededRandomSampler`
    use), cut into chunks of ``batch_size``. ``dynamic=True`` gives the next chunk to whoever asks
    first, so a fast worker takes more of the epoch; ``dynamic=False`` gives worker ``w`` its
    ``k``-th chunk as chunk ``k * num_workers + w``, so each round of ``num_workers`` chunks is
    one contiguous global batch, exactly the samples of one DDP step.

    ``max_chunks`` caps the chunks per epoch (Lightning's ``limit_train_batches`` times workers);
    ``shuffle=False`` deals ``0, 1, 2, ...`` in order every epoch (a sequential sampler, ``overfit_batches``).

    Example::

        >>> d = ChunkDispenser(num_samples=10, batch_size=4, num_workers=2, seed=0)
        >>> d.start_epoch(0)
        >>> sorted(len(d.next_chunk(w)) for w in (0, 1, 0))
        [2, 4, 4]
        >>> d.next_chunk(1) is None
        True
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        num_workers: int,
        seed: int = 0,
        drop_last: bool = False,
        dynamic: bool = True,
        max_chunks: int | None = None,
        shuffle: bool = True,
    ) -> None:
        if num_samples < 1 or batch_size < 1:
            raise ValueError(f"need samples and a batch size, got {num_samples} samples, batch size {batch_size}")
        self.num_samples, self.batch_size, self.num_workers = num_samples, batch_size, num_workers
        self.seed, self.dynamic, self.shuffle = seed, dynamic, shuffle
        per_epoch = num_samples // batch_size if drop_last else math.ceil(num_samples / batch_size)
        self.num_chunks = per_epoch if max_chunks is None else min(per_epoch, max_chunks)
        self.epoch: int | None = None

    def start_epoch(self, epoch: int) -> None:
        if self.shuffle:
            self._order = torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(self.seed + epoch))
        else:
            self._order = torch.arange(self.num_samples)
        self._next = 0
        self._taken = [0] * self.num_workers
        self.epoch = epoch

    def next_chunk(self, worker: int) -> torch.Tensor | None:
        """The next chunk of sample indices for ``worker``, or None when its epoch is over."""
        if self.dynamic:
            index, self._next = self._next, self._next + 1
        else:
            index = self._taken[worker] * self.num_workers + worker
        if index >= self.num_chunks:
            return None
        self._taken[worker] += 1
        return self._order[index * self.batch_size : (index + 1) * self.batch_size]
