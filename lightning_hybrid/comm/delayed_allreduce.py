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

As under DDP (``find_unused_parameters=True``), a parameter without a gradient on any rank in a step
(frozen, or unused in that step) gets no average: its ``.grad`` is left ``None`` and torch's optimizers
do not step it, so weight decay and momentum do not move it; one with a gradient on some ranks only gets
the average of the ranks' gradients, zeros for those without one. Each exchange carries which parameters
had a gradient on each rank, beside the rank's stop request, at the end of its first bucket. A step's
gradient clip (:class:`~lightning_hybrid.comm.clipping.Clip`) can be applied to its average, as DDP
clips the average (:meth:`DelayedAllReduce.push` before clipping, :meth:`DelayedAllReduce.clip_newest` after).
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from lightning_hybrid.comm.clipping import Clip
from lightning_hybrid.comm.collectives import Pending, start_all_reduce
from lightning_hybrid.comm.flat import flatten, gradients, slices
from lightning_hybrid.comm.stop_signal import WIDTH, decode, encode

COMPENSATIONS = (None, "dc")


@dataclass
class InFlight:
    """One exchange: this rank's values (gradients, or updates) being averaged with the other ranks'."""

    buckets: list[torch.Tensor]  # flat buckets being all-reduced (summed in place); the first ends with the header
    works: list[Pending]
    weights: torch.Tensor | None  # the flat weights the gradient was computed at (for compensation)
    lrs: list[float] | None  # each parameter group's learning rate when the gradient was computed
    local: torch.Tensor | None = None  # this rank's own values, flat (``keep_local``)
    tag: Any = None  # the caller's, e.g. the step that pushed it
    averaged: bool = False  # the all-reduce is complete and the buckets hold the average
    stop: int = 0  # the largest stop signal a rank's request carried in this exchange (once averaged)
    used: torch.Tensor | None = None  # once averaged: which parameters had a gradient on some rank (bool)
    clip: Clip | None = None  # how the step that pushed it clipped its own gradient: applied to the average

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
            the background while Lightning's run on the main thread. Or a list of groups of the same ranks
            (lanes): push ``k`` goes through lane ``k mod len``, so that more exchanges run at once than one
            group runs (gloo two, NCCL one; :func:`~lightning_hybrid.comm.regime.lanes`).
        compensation: ``None`` or ``"dc"`` (delay compensation, see the module docstring).
        dc_lambda: DC-ASGD's lambda.
        while_waiting: called about every second while this rank waits for an exchange to complete
            (gloo; :func:`~lightning_hybrid.comm.collectives.wait_in_pieces`): it may raise, to end a
            wait for ranks that will not come (their data ran out, a stop was asked for).

    Each push also carries which parameters this rank has a gradient for and this rank's stop request (:mod:`~lightning_hybrid.comm.stop_signal`): once an
    exchange is complete, :attr:`stop` is the largest signal any rank asked for in it or an earlier
    one, the same on every rank after the same exchange, so that ranks that meet only here agree on a
    stop here.
    """

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        delay: int,
        bucket_size_mb: float = 25.0,
        group: dist.ProcessGroup | Sequence[dist.ProcessGroup] | None = None,
        compensation: str | None = None,
        dc_lambda: float = 0.04,
        while_waiting: Callable[[], None] | None = None,
    ) -> None:
        validate(delay, compensation, dc_lambda, bucket_size_mb)
        self.while_waiting = while_waiting
        self.params = list(params)
        self.delay = delay
        self.lanes = list(group) if isinstance(group, (list, tuple)) else [group]
        self.group = self.lanes[0]
        self._pushes = 0  # the lane of the next push: the same on every rank
        self.compensation = compensation
        self.dc_lambda = dc_lambda
        self.bucket_indices = make_buckets(self.params, bucket_size_mb)
        self.world_size = dist.get_world_size(self.group)
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
             keep_local: bool = False, tag: Any = None, used: Sequence[bool] | None = None) -> None:
        """Snapshot the current gradients (or ``values``, one tensor per parameter) into buckets and
        start their all-reduce, this rank's ``stop`` request (a signal number, 0: none) with them.
        ``lrs``: the learning rates to apply their average with (see :func:`step_at`); ``keep_local``:
        keep a flat copy of this rank's own values beside the average (:attr:`InFlight.local`);
        ``used``: which parameters this rank has a value for (default: those whose ``.grad`` is not
        None; with ``values``: all), the others counting as zeros."""
        if values is None:
            used = [p.grad is not None for p in self.params] if used is None else used
            values = gradients(self.params)
        else:
            values = list(values)
            used = [True] * len(values) if used is None else used
        local = flatten(values).clone() if keep_local else None  # before the all-reduces sum in place
        buckets, works = [], []
        lane = self.lanes[self._pushes % len(self.lanes)]
        self._pushes += 1
        for i, indices in enumerate(self.bucket_indices):
            pieces = [values[j] for j in indices]
            bucket = flatten(pieces) if i else torch.cat([flatten(pieces), self._header(used, stop, pieces[0])])
            self.bytes_sent += bucket.numel() * bucket.element_size()
            buckets.append(bucket)
            works.append(start_all_reduce(bucket, group=lane))
        weights = self._flat_weights() if self.compensation == "dc" else None
        self._queue.append(InFlight(buckets, works, weights, None if lrs is None else list(lrs), local, tag))

    def _header(self, used: Sequence[bool], stop: int, like: torch.Tensor) -> torch.Tensor:
        """What the first bucket carries after its values: a count per parameter of the ranks with a
        gradient for it, then the stop flags (:mod:`~lightning_hybrid.comm.stop_signal`)."""
        counts = torch.tensor([1.0 if u else 0.0 for u in used], dtype=like.dtype, device=like.device)
        return torch.cat([counts, encode(stop, like.dtype, like.device)])

    def _complete(self, item: InFlight) -> InFlight:
        if item.averaged:
            return item
        start = time.perf_counter()
        for work in item.works:
            work.wait(self.while_waiting)
        self.wait_s += time.perf_counter() - start
        first = item.buckets[0]
        header = len(self.params) + WIDTH
        item.stop = decode(first[-WIDTH:])
        item.used = first[-header:-WIDTH] > 0.5
        self.stop = max(self.stop, item.stop)
        item.buckets = [first[:-header].div_(self.world_size), *(b.div_(self.world_size) for b in item.buckets[1:])]
        item.works, item.averaged = [], True
        return item

    def pop_ready(self) -> InFlight | None:
        """The oldest exchange, completed (waited for if it is not), once it is ``delay`` pushes old; else None."""
        return self._complete(self._queue.popleft()) if len(self._queue) > self.delay else None

    def pop_oldest(self) -> InFlight | None:
        """The oldest exchange, completed, whatever its age; None when nothing is pending."""
        return self._complete(self._queue.popleft()) if self._queue else None

    def clip_newest(self, clip: Clip | None) -> None:
        """How the step that pushed the newest exchange clipped its own gradient: its average is clipped so
        (:meth:`write`), as DDP clips the average (push before clipping, say how after)."""
        self._queue[-1].clip = clip

    def pending_state(self) -> list[dict]:
        """The pending exchanges (waited for), oldest first, as plain tensors and lists: what a
        checkpoint written between sync points must hold so that nothing computed is lost."""
        return [
            {"average": self._complete(item).average.clone(), "weights": item.weights, "lrs": item.lrs,
             "local": item.local, "tag": item.tag, "used": item.used, "clip": item.clip}
            for item in self._queue
        ]

    def load_pending_state(self, state: list[dict]) -> None:
        """Put exchanges from :meth:`pending_state` back in front of the queue, to be handed back in
        order as if they had never left it; the stop requests they carried are not (the run that wrote
        them stopped on them; this one is a new run)."""
        restored = [
            InFlight([entry["average"].clone()], [], entry["weights"], entry["lrs"], entry.get("local"), entry.get("tag"),
                     averaged=True, used=entry.get("used", torch.ones(len(self.params), dtype=torch.bool)),
                     clip=entry.get("clip"))
            for entry in state
        ]
        self._queue.extendleft(reversed(restored))

    def pending_items(self) -> list[InFlight]:
        """The pending exchanges, oldest first, each waited for (still pending: nothing is handed back)."""
        return [self._complete(item) for item in self._queue]

    def settled(self, optimizer: torch.optim.Optimizer) -> tuple[list[torch.Tensor], dict[str, Any]]:
        """The weights (in :attr:`params`' order) and ``optimizer``'s state dict after stepping with every
        pending average (as :meth:`apply_pending` would), as copies; the rank's own are left as they are
        (the same tensors, holding the same values)."""
        weights = [p.detach().clone() for p in self.params]
        grads = [p.grad for p in self.params]
        states = {p: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in optimizer.state[p].items()}
                  for p in self.params if p in optimizer.state}
        loaded = self.loaded_lrs
        try:
            for item in self.pending_items():
                self.write(item)
                step_at(optimizer, item.lrs)
            return [p.detach().clone() for p in self.params], copy.deepcopy(optimizer.state_dict())
        finally:
            with torch.no_grad():
                for p, w, g in zip(self.params, weights, grads):
                    p.copy_(w)
                    p.grad = g
                    if p not in states:
                        optimizer.state.pop(p, None)
                        continue
                    state = optimizer.state[p]
                    for key in [k for k in state if k not in states[p]]:
                        del state[key]
                    for key, value in states[p].items():
                        if isinstance(value, torch.Tensor) and isinstance(state.get(key), torch.Tensor):
                            state[key].copy_(value)
                        else:
                            state[key] = value
            self.loaded_lrs = loaded

    def write(self, item: InFlight) -> None:
        """Write an average (compensated; clipped as its step clipped its own gradient, :meth:`clip_newest`, as
        DDP clips the average) into ``.grad``; a parameter no rank had a gradient for gets ``None``, so that the
        optimizer leaves it alone."""
        flat = item.average
        if self.compensation == "dc":
            flat = flat + self.dc_lambda * flat * flat * (self._flat_weights() - item.weights)
        used = item.used if item.used is not None else [True] * len(self.params)
        for p, piece, on in zip(self.params, slices(flat, self.params), used):
            p.grad = piece.clone() if on else None
        if item.clip is not None:
            item.clip.apply([p.grad for p in self.params if p.grad is not None])
        self.loaded_lrs = item.lrs

    def load_ready_into_grads(self) -> bool:
        """If an average is ``delay`` pushes old, write it (:meth:`write`) into ``.grad``; say whether."""
        item = self.pop_ready()
        if item is None:
            return False
        self.write(item)
        return True

    def drain_into_grads(self) -> Iterator[None]:
        """Write every pending average into ``.grad`` (:meth:`write`), oldest first, yielding after each (step then)."""
        while (item := self.pop_oldest()) is not None:
            self.write(item)
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
