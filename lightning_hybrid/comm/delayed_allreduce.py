"""Gradients all-reduced in the background and applied a fixed number of steps later.

Pipe-SGD (Li et al. 2018) makes ring all-reduce data parallelism asynchronous in the only sound
way a collective allows: the all-reduce of step ``t``'s gradients runs while steps ``t+1, ...``
compute, and its average is applied ``delay`` optimizer steps after the step that computed it.
DC-ASGD (Zheng et al. 2017) corrects such a stale gradient ``g`` computed at weights ``w_then``
before it is applied at ``w_now``: ``g + lambda * g * g * (w_now - w_then)``, elementwise.

:class:`DelayedAllReduce` is plain torch.distributed (gloo or NCCL), usable without Lightning:

    exchange = DelayedAllReduce(params, delay=1)
    for batch in batches:
        loss(batch).backward()
        exchange.push(learning_rates(optimizer))  # starts the bucketed all-reduce of these gradients
        if exchange.load_ready_into_grads():      # the average from `delay` steps ago, if any
            step_at(optimizer, exchange.loaded_lrs)
        optimizer.zero_grad()
    exchange.apply_pending(optimizer)             # at a sync point: apply what is pending, in order

Each average is applied with the learning rates in force when its gradients were computed (recorded
by ``push``): a scheduler that moves the rate in between, at an epoch's end say, does not change the
rate of steps already computed, exactly as under DDP.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from lightning_hybrid.comm.collectives import Pending, start_all_reduce
from lightning_hybrid.comm.flat import flatten, gradients, slices
from lightning_hybrid.comm.stop_signal import WIDTH, decode, encode

COMPENSATIONS = (None, "dc")


@dataclass
class InFlight:
    """One exchange: this rank's values (gradients, or updates) being averaged with the other ranks'."""

    buckets: list[torch.Tensor]  # flat buckets being all-reduced (summed in place); the first ends with the stop flags
    works: list[Pending]
    weights: torch.Tensor | None  # the flat weights the gradient was computed at (for compensation)
    lrs: list[float] | None  # each parameter group's learning rate when the gradient was computed
    local: torch.Tensor | None = None  # this rank's own values, flat (``keep_local``)
    tag: Any = None  # the caller's, e.g. the step that pushed it
    averaged: bool = False  # the all-reduce is complete and the buckets hold the average
    stop: int = 0  # the largest stop signal a rank's request carried in this exchange (once averaged)

    @property
    def average(self) -> torch.Tensor:
        """The average over the ranks, flat (once completed)."""
        assert self.averaged, "wait for the exchange first"
        return self.buckets[0] if len(self.buckets) == 1 else torch.cat(self.buckets)


def learning_rates(optimizer: torch.optim.Optimizer) -> list[float]:
    """Each parameter group's learning rate, in order."""
    return [float(group["lr"]) for group in optimizer.param_groups]


def step_at(optimizer: torch.optim.Optimizer, lrs: Sequence[float] | None) -> None:
    """``optimizer.step()`` with each group's learning rate set to ``lrs`` (``None``: as it is), the
    rates in force restored afterwards."""
    if lrs is None:
        optimizer.step()
        return
    current = learning_rates(optimizer)
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    try:
        optimizer.step()
    finally:
        for group, lr in zip(optimizer.param_groups, current):
            group["lr"] = lr


def validate(delay: int, compensation: str | None, dc_lambda: float, bucket_size_mb: float) -> None:
    """Raise a ValueError that says what is wrong with these settings."""
    if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
        raise ValueError(f"delay must be a non-negative integer number of optimizer steps, got {delay!r}")
    if compensation not in COMPENSATIONS:
        raise ValueError(f"unknown compensation {compensation!r}; choose None or 'dc' (DC-ASGD)")
    if not dc_lambda >= 0:
        raise ValueError(f"dc_lambda must be non-negative, got {dc_lambda}")
    if not bucket_size_mb > 0:
        raise ValueError(f"bucket_size_mb must be positive, got {bucket_size_mb}")


def make_buckets(params: Sequence[torch.Tensor], bucket_size_mb: float) -> list[list[int]]:
    """Consecutive parameter indices grouped so that each group holds at most ``bucket_size_mb``
    of gradient (a parameter larger than that gets a bucket of its own)."""
    limit = bucket_size_mb * 2**20
    buckets: list[list[int]] = [[]]
    size = 0
    for i, p in enumerate(params):
        nbytes = p.numel() * p.element_size()
        if buckets[-1] and size + nbytes > limit:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return [b for b in buckets if b]


class DelayedAllReduce:
    """Averages values (by default the gradients) across a process group in the background; hands each
    average back ``delay`` pushes later.

    Args:
        params: the parameters whose ``.grad`` (or the values given to :meth:`push`) is exchanged, in
            a fixed order on every rank.
        delay: how many later pushes an average waits for before it is handed back; 0 is a
            synchronous all-reduce (DDP's result).
        bucket_size_mb: values are flattened into buckets of about this size, one collective each.
        group: the process group (default: the world). Use a group of its own: its collectives run in
            the background while Lightning's run on the main thread.
        compensation: ``None`` or ``"dc"`` (delay compensation, see the module docstring).
        dc_lambda: DC-ASGD's lambda.

    Each push also carries this rank's stop request (:mod:`~lightning_hybrid.comm.stop_signal`): once an
    exchange is complete, :attr:`stop` is the largest signal any rank asked for in it or an earlier
    one, the same on every rank after the same exchange, so that ranks that meet only here agree on a
    stop here.
    """

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        delay: int,
        bucket_size_mb: float = 25.0,
        group: dist.ProcessGroup | None = None,
        compensation: str | None = None,
        dc_lambda: float = 0.04,
    ) -> None:
        validate(delay, compensation, dc_lambda, bucket_size_mb)
        self.params = list(params)
        self.delay = delay
        self.group = group
        self.compensation = compensation
        self.dc_lambda = dc_lambda
        self.bucket_indices = make_buckets(self.params, bucket_size_mb)
        self.world_size = dist.get_world_size(group)
        self._queue: deque[InFlight] = deque()
        #: Seconds spent blocked waiting for collectives to finish (the communication not hidden).
        self.wait_s = 0.0
        #: Bytes of values this rank has handed to its all-reduces (the payload; a ring all-reduce puts
        #: ``2 (world - 1) / world`` times that on each rank's link).
        self.bytes_sent = 0
        #: The learning rates pushed with the average last written into ``.grad`` (None if not given).
        self.loaded_lrs: list[float] | None = None
        #: The largest stop signal carried by a completed exchange (0: none asked for).
        self.stop = 0

    @property
    def pending(self) -> int:
        """Averages started but not yet handed back."""
        return len(self._queue)

    def _flat_weights(self) -> torch.Tensor:
        return flatten(self.params)

    def push(self, lrs: Sequence[float] | None = None, stop: int = 0, values: Sequence[torch.Tensor] | None = None,
             keep_local: bool = False, tag: Any = None) -> None:
        """Snapshot the current gradients (or ``values``, one tensor per parameter) into buckets and
        start their all-reduce, this rank's ``stop`` request (a signal number, 0: none) with them.
        ``lrs``: the learning rates to apply their average with (see :func:`step_at`); ``keep_local``:
        keep a flat copy of this rank's own values beside the average (:attr:`InFlight.local`)."""
        values = gradients(self.params) if values is None else list(values)
        local = flatten(values).clone() if keep_local else None  # before the all-reduces sum in place
        buckets, works = [], []
        for i, indices in enumerate(self.bucket_indices):
            pieces = [values[j] for j in indices]
            bucket = flatten(pieces) if i else torch.cat([flatten(pieces), encode(stop, pieces[0].dtype, pieces[0].device)])
            self.bytes_sent += bucket.numel() * bucket.element_size()
            buckets.append(bucket)
            works.append(start_all_reduce(bucket, group=self.group))
        weights = self._flat_weights() if self.compensation == "dc" else None
        self._queue.append(InFlight(buckets, works, weights, None if lrs is None else list(lrs), local, tag))

    def _complete(self, item: InFlight) -> InFlight:
        if item.averaged:
            return item
        start = time.perf_counter()
        for work in item.works:
            work.wait()
        self.wait_s += time.perf_counter() - start
        first = item.buckets[0]
        item.stop = decode(first[-WIDTH:])
        self.stop = max(self.stop, item.stop)
        item.buckets = [first[:-WIDTH].div_(self.world_size), *(b.div_(self.world_size) for b in item.buckets[1:])]
        item.works, item.averaged = [], True
        return item

    def pop_ready(self) -> InFlight | None:
        """The oldest exchange, completed (waited for if it is not), once it is ``delay`` pushes old; else None."""
        return self._complete(self._queue.popleft()) if len(self._queue) > self.delay else None

    def pop_oldest(self) -> InFlight | None:
        """The oldest exchange, completed, whatever its age; None when nothing is pending."""
        return self._complete(self._queue.popleft()) if self._queue else None

    def pending_state(self) -> list[dict]:
        """The pending exchanges (waited for), oldest first, as plain tensors and lists: what a
        checkpoint written between sync points must hold so that nothing computed is lost."""
        return [
            {"average": self._complete(item).average.clone(), "weights": item.weights, "lrs": item.lrs,
             "local": item.local, "tag": item.tag}
            for item in self._queue
        ]

    def load_pending_state(self, state: list[dict]) -> None:
        """Put exchanges from :meth:`pending_state` back in front of the queue, to be handed back in
        order as if they had never left it; the stop requests they carried are not (the run that wrote
        them stopped on them; this one is a new run)."""
        restored = [
            InFlight([entry["average"].clone()], [], entry["weights"], entry["lrs"], entry.get("local"), entry.get("tag"),
                     averaged=True)
            for entry in state
        ]
        self._queue.extendleft(reversed(restored))

    def _write(self, item: InFlight) -> None:
        flat = item.average
        if self.compensation == "dc":
            flat = flat + self.dc_lambda * flat * flat * (self._flat_weights() - item.weights)
        for p, piece in zip(self.params, slices(flat, self.params)):
            p.grad = piece.clone()
        self.loaded_lrs = item.lrs

    def load_ready_into_grads(self) -> bool:
        """If an average is ``delay`` pushes old, write it (compensated) into ``.grad``; say whether."""
        item = self.pop_ready()
        if item is None:
            return False
        self._write(item)
        return True

    def drain_into_grads(self) -> Iterator[None]:
        """Write every pending average into ``.grad``, oldest first, yielding after each (step then)."""
        while (item := self.pop_oldest()) is not None:
            self._write(item)
            yield

    def apply_pending(self, optimizer: torch.optim.Optimizer) -> int:
        """At a sync point: step ``optimizer`` with every pending average, oldest first, each at the
        learning rates pushed with it, then zero the gradients; return how many were applied (all
        ranks call this at the same point)."""
        applied = 0
        for _ in self.drain_into_grads():
            step_at(optimizer, self.loaded_lrs)
            applied += 1
        optimizer.zero_grad()
        return applied
