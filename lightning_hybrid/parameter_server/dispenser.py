"""Handing out an epoch's batches to workers on request, each sample exactly once per epoch."""

from __future__ import annotations

import math
from collections import deque

import torch


def chunks_per_epoch(num_samples: int, batch_size: int, drop_last: bool = False, max_chunks: int | None = None) -> int:
    """Batches of ``batch_size`` in an epoch of ``num_samples`` (the last one short unless
    ``drop_last``), at most ``max_chunks``."""
    per_epoch = num_samples // batch_size if drop_last else math.ceil(num_samples / batch_size)
    return per_epoch if max_chunks is None else min(per_epoch, max_chunks)


def segment_chunks(val_check_interval: int | float, num_chunks: int, workers: int) -> int:
    """Chunks per segment of an epoch of ``num_chunks`` for Lightning's ``val_check_interval``, as
    DDP with ``workers`` ranks validates: a fraction of each rank's batches, or every N batches of
    each rank; 0 when the epoch is one segment (validation at its end only)."""
    if isinstance(val_check_interval, float):
        if val_check_interval >= 1.0:
            return 0
        per_worker = math.ceil(num_chunks / workers)
        segment = max(1, int(per_worker * val_check_interval)) * workers
    else:
        segment = int(val_check_interval) * workers
    return segment if segment < num_chunks else 0


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
    ``segment_chunks`` cuts the epoch into segments of that many chunks (:meth:`segment_of`), with a
    global synchronization between them (mid-epoch validation); a worker dealt a chunk of a later
    segment than the one it trains in synchronizes before training it.

    A worker *holds* the chunks dealt to it until it reports them trained (:meth:`trained`). When a
    worker is lost (:meth:`lose`), the chunks it held are dealt again, to whoever asks first, before
    any new one, and it gets none from then on; with ``dynamic=False`` the rest of that epoch is
    dealt dynamically, and from the next epoch each round is one chunk per remaining worker. Every
    sample is still trained on exactly once per epoch.

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
        segment_chunks: int = 0,
    ) -> None:
        if num_samples < 1 or batch_size < 1:
            raise ValueError(f"need samples and a batch size, got {num_samples} samples, batch size {batch_size}")
        self.num_samples, self.batch_size, self.num_workers = num_samples, batch_size, num_workers
        self.seed, self.dynamic, self.shuffle = seed, dynamic, shuffle
        self.num_chunks = chunks_per_epoch(num_samples, batch_size, drop_last, max_chunks)
        self.segment_chunks = segment_chunks
        self.epoch: int | None = None
        self.members = list(range(num_workers))  # the workers not lost, in rank order
        self.last_segment = 0  # the segment of the chunk dealt last
        self._held: dict[int, deque[int]] = {}

    def lose(self, worker: int) -> int:
        """``worker`` is gone: deal the chunks it held again; return how many there were."""
        if worker not in self.members:
            return 0
        self.members.remove(worker)
        if self.epoch is None:
            return 0
        held = sorted(self._held.pop(worker, ()))
        if not self.dynamic and not self._dynamic_now:  # the static rounds no longer fit: the rest dynamically
            dealt = {i for chunks in self._held.values() for i in chunks} | self._trained
            self._undealt = deque(i for i in range(self.num_chunks) if i not in dealt and i not in held)
            self._dynamic_now = True
        last = self.num_chunks - 1
        if last in held and self._undealt:  # the epoch's last chunk may be short: dealt last, it ends a worker's epoch
            held.remove(last)
            self._undealt.append(last)
        self._again.extend(held)
        return len(held)

    def trained(self, worker: int, chunks: int = 1) -> None:
        """``worker`` has trained on (pushed the gradient of) its ``chunks`` oldest held chunks."""
        held = self._held.get(worker)
        for _ in range(min(chunks, len(held) if held else 0)):
            self._trained.add(held.popleft())

    def held(self, worker: int) -> int:
        """Chunks dealt to ``worker`` and not yet reported trained."""
        return len(self._held.get(worker, ()))

    def start_epoch(self, epoch: int) -> None:
        if self.shuffle:
            self._order = torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(self.seed + epoch))
        else:
            self._order = torch.arange(self.num_samples)
        self._next = 0
        self._taken = [0] * self.num_workers
        self._held = {w: deque() for w in self.members}
        self._trained: set[int] = set()
        self._again: deque[int] = deque()  # chunks a lost worker held, dealt again first
        self._undealt: deque[int] = deque()
        self._dynamic_now = False  # a static epoch after a loss
        self.epoch = epoch

    def next_chunk(self, worker: int) -> torch.Tensor | None:
        """The next chunk of sample indices for ``worker``, or None when its epoch is over."""
        if worker not in self.members:
            return None
        if self._again:
            index = self._again.popleft()
        elif self._dynamic_now:
            index = self._undealt.popleft() if self._undealt else self.num_chunks
        elif self.dynamic:
            index, self._next = self._next, self._next + 1
        else:
            index = self._taken[worker] * len(self.members) + self.members.index(worker)
        if index >= self.num_chunks:
            return None
        self._taken[worker] += 1
        self._held[worker].append(index)
        self.last_segment = self.segment_of(index)
        return self._order[index * self.batch_size : (index + 1) * self.batch_size]

    def exhausted(self) -> bool:
        """Whether every chunk of the epoch has been dealt (no member would get another)."""
        if self._again:
            return False
        if self._dynamic_now:
            return not self._undealt
        if self.dynamic:
            return self._next >= self.num_chunks
        return all(self._taken[w] * len(self.members) + self.members.index(w) >= self.num_chunks for w in self.members)

    def segment_of(self, index: int) -> int:
        """The epoch's segment chunk ``index`` belongs to (0 without segments). The last segment
        holds at least one chunk per worker (a shorter rest joins the segment before it): every
        worker trains in every segment, so all meet at every sync between them."""
        if self.segment_chunks <= 0:
            return 0
        last = max(0, (self.num_chunks - len(self.members)) // self.segment_chunks)
        return min(index // self.segment_chunks, last)


class OneDataset:
    """The server deals sample indices of one dataset to every worker: the first worker's size, and a refusal for
    a worker whose training data has another (ranks with their own data, ``use_distributed_sampler=False``)."""

    def __init__(self) -> None:
        self.first: tuple[int, int] | None = None  # (worker, samples)

    def check(self, worker: int, num_samples: int) -> str | None:
        """None if ``worker``'s training data has as many samples as the first worker's, else what to tell it."""
        if self.first is None:
            self.first = (worker, num_samples)
        if num_samples == self.first[1]:
            return None
        return (f"worker {worker}'s training data has {num_samples} samples and worker {self.first[0]}'s {self.first[1]}: "
                "the server deals the sample indices of one dataset to every worker; give every worker the same dataset "
                "(Lightning's distributed sampler does, use_distributed_sampler=True), or keep each rank's own data with a "
                "strategy that trains on it (delayed_averaging or local_sgd with as many batches on every rank; cneural)")
