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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lightning_hybrid.comm.collectives import Pending, all_reduce_, start_all_reduce
from lightning_hybrid.comm.flat import flatten, gradients, slices

COMPENSATIONS = (None, "dc")


@dataclass
class _InFlight:
    buckets: list[torch.Tensor]  # flat gradient buckets being all-reduced (summed in place)
    works: list[Pending | Future]
    weights: torch.Tensor | None  # the flat weights the gradient was computed at (for compensation)
    lrs: list[float] | None  # each parameter group's learning rate when the gradient was computed
    averaged: bool = False  # the all-reduce is complete and the buckets hold the average


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
    """Averages gradients across a process group asynchronously; hands each back ``delay`` pushes later.

    Args:
        params: the parameters whose ``.grad`` is exchanged (in a fixed order on every rank).
        delay: how many later pushes an average waits for before it is handed back; 0 is a
            synchronous all-reduce (DDP's result).
        bucket_size_mb: gradients are flattened into buckets of about this size, one collective each.
        group: the process group (default: the world).
        compensation: ``None`` or ``"dc"`` (delay compensation, see the module docstring).
        dc_lambda: DC-ASGD's lambda.
        latency_s: simulated network latency added to every collective (heterogeneity simulation):
            the collectives are then issued, in order, by one background thread that sleeps this
            long before each, so the latency overlaps with computation as a real one would.
            Use a process group of its own (``group``) then: Lightning's collectives on the main
            thread must not interleave with these.
    """

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        delay: int,
        bucket_size_mb: float = 25.0,
        group: dist.ProcessGroup | None = None,
        compensation: str | None = None,
        dc_lambda: float = 0.04,
        latency_s: float = 0.0,
    ) -> None:
        validate(delay, compensation, dc_lambda, bucket_size_mb)
        if not latency_s >= 0:
            raise ValueError(f"latency_s must be non-negative, got {latency_s}")
        self.params = list(params)
        self.delay = delay
        self.group = group
        self.compensation = compensation
        self.dc_lambda = dc_lambda
        self.bucket_indices = make_buckets(self.params, bucket_size_mb)
        self.world_size = dist.get_world_size(group)
        self._queue: deque[_InFlight] = deque()
        self.latency_s = latency_s
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="delayed-allreduce") if latency_s > 0 else None
        #: Seconds spent blocked waiting for collectives to finish (the communication not hidden).
        self.wait_s = 0.0
        #: Bytes of gradients this rank has handed to its all-reduces (the payload; a ring all-reduce puts
        #: ``2 (world - 1) / world`` times that on each rank's link).
        self.bytes_sent = 0
        #: The learning rates pushed with the average last written into ``.grad`` (None if not given).
        self.loaded_lrs: list[float] | None = None

    def _all_reduce(self, bucket: torch.Tensor) -> Pending | Future:
        if self._thread is None:
            return start_all_reduce(bucket, group=self.group)

        def slow_all_reduce() -> None:
            time.sleep(self.latency_s)
            all_reduce_(bucket, group=self.group)

        return self._thread.submit(slow_all_reduce)

    def close(self) -> None:
        """Stop the background thread of the latency simulation (pending work is finished first)."""
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None

    @property
    def pending(self) -> int:
        """Averages started but not yet handed back."""
        return len(self._queue)

    def _flat_weights(self) -> torch.Tensor:
        return flatten(self.params)

    def push(self, lrs: Sequence[float] | None = None) -> None:
        """Snapshot the current gradients into buckets and start their all-reduce; ``lrs``: the
        learning rates to apply their average with (see :func:`step_at`)."""
        buckets, works = [], []
        for indices in self.bucket_indices:
            bucket = flatten(gradients([self.params[i] for i in indices]))
            self.bytes_sent += bucket.numel() * bucket.element_size()
            buckets.append(bucket)
            works.append(self._all_reduce(bucket))
        weights = self._flat_weights() if self.compensation == "dc" else None
        self._queue.append(_InFlight(buckets, works, weights, None if lrs is None else list(lrs)))

    def _complete(self, item: _InFlight) -> list[torch.Tensor]:
        if item.averaged:
            return item.buckets
        start = time.perf_counter()
        for work in item.works:
            work.result() if isinstance(work, Future) else work.wait()
        self.wait_s += time.perf_counter() - start
        item.buckets = [bucket.div_(self.world_size) for bucket in item.buckets]
        item.works, item.averaged = [], True
        return item.buckets

    def pending_state(self) -> list[dict]:
        """The pending averages (waited for), oldest first, as plain tensors and lists: what a
        checkpoint written between sync points must hold so that nothing computed is lost."""
        return [
            {"average": torch.cat(self._complete(item)).clone(), "weights": item.weights, "lrs": item.lrs}
            for item in self._queue
        ]

    def load_pending_state(self, state: list[dict]) -> None:
        """Put averages from :meth:`pending_state` back in front of the queue, to be applied in
        order as if they had never left it."""
        restored = [
            _InFlight([entry["average"].clone()], [], entry["weights"], entry["lrs"], averaged=True) for entry in state
        ]
        self._queue.extendleft(reversed(restored))

    def _write(self, item: _InFlight) -> None:
        averaged = self._complete(item)
        flat = torch.cat(averaged)
        if self.compensation == "dc":
            flat = flat + self.dc_lambda * flat * flat * (self._flat_weights() - item.weights)
        for p, piece in zip(self.params, slices(flat, self.params)):
            p.grad = piece.clone()
        self.loaded_lrs = item.lrs

    def load_ready_into_grads(self) -> bool:
        """If an average is ``delay`` pushes old, write it (compensated) into ``.grad``; say whether."""
        if len(self._queue) <= self.delay:
            return False
        self._write(self._queue.popleft())
        return True

    def drain_into_grads(self) -> Iterator[None]:
        """Write every pending average into ``.grad``, oldest first, yielding after each (step then)."""
        while self._queue:
            self._write(self._queue.popleft())
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
