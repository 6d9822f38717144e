"""The DDP communication hook of balanced data parallelism, and the clock that splits a rank's cycle
into its own time and its wait for the others.

Gradients: each rank's loss is already weighted by its share of the global batch (the strategy
multiplies it by ``samples / global samples``), so :func:`timed_sum_hook` sums each gradient bucket
across the ranks, where DDP's default hook averages: the sum is the mean gradient over the global
batch, one step of single-process SGD on it.

Timing (:class:`CycleClock`): a rank's cycle runs from the end of one step's all-reduce to the end
of the next one's: the optimizer step, the user's hooks and callbacks, logging, loading the next
batch, forward and backward. The last gradient bucket becoming ready ends the rank's own part of
the cycle (on CUDA the clock waits for the device first); the rest, until the all-reduce returns,
is waiting for the slower ranks. A rank's speed is samples over its own time, so a rank that is
slow anywhere in its cycle (a slow data loader, a heavy callback, a busier host) looks slow, and
waiting never inflates the time that decides the shares. Where the cycle was interrupted by
something all ranks do together (validation, an epoch's end: :meth:`CycleClock.interrupt`), the
next cycle starts with the step's first batch instead; the strategy's own collectives inside a
cycle (a rebalancing's gather: :meth:`CycleClock.paused`) count as waiting. The
all-reduce must be the cycle's only synchronization point: the strategy agrees on a stop
a batch late, in the background (``Deferred``, in the Lightning glue's per-batch meeting point); a collective of the
user's inside the step (``self.log(..., on_step=True, sync_dist=True)``, BatchNorm buffers
broadcast by DDP) is another, at which a fast rank's wait counts as its own time.

A simulated compute slowdown (``sim.where=compute``) sleeps ``(factor - 1) x`` the step's forward
and backward right before the last bucket's all-reduce starts, so the other ranks really wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from lightning_hybrid.comm.collectives import all_reduce_future
from lightning_hybrid.sim.slowdown import stretch


class CycleClock:
    """The state :func:`timed_sum_hook` is registered with: one rank's cycle timing.

    Args:
        slowdown: simulated slowdown factor of this rank's forward and backward (>= 1).
        group: the process group the buckets are summed over (``None``: the default group).
        now, sleep: the clock and the sleep (replaceable in tests).

    Example::

        >>> t = [0.0]
        >>> clock = CycleClock(now=lambda: t[0])
        >>> clock.start(); t[0] = 0.3; clock.last_bucket_ready(); t[0] = 0.4
        >>> clock.backward_done()  # 0.3 s of its own, 0.1 s waiting for the others
        (0.3, 0.1...)
    """

    def __init__(
        self,
        slowdown: float = 1.0,
        group: dist.ProcessGroup | None = None,
        now: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not slowdown >= 1.0:
            raise ValueError(f"a compute slowdown factor must be >= 1.0, got {slowdown}")
        self.slowdown, self.group, self._now, self._sleep = float(slowdown), group, now, sleep
        self.device: torch.device | None = None
        self._cycle_start: float | None = None  # the last all-reduce's end (None: interrupted)
        self._step_start: float | None = None  # the optimizer step's first batch
        self._ready: float | None = None
        self._paused = 0.0  # collectives of the strategy's own inside the cycle (not the rank's time)
        #: Seconds slept for the simulated slowdown, over the whole run.
        self.slept = 0.0

    def _synchronize(self) -> None:
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the kernels launched so far have run

    def start(self) -> None:
        """An optimizer step's first batch starts (an interrupted cycle starts here)."""
        self._step_start, self._ready = self._now(), None
        if self._cycle_start is None:
            self._cycle_start = self._step_start

    def interrupt(self) -> None:
        """Something every rank does together came between two steps: the next cycle starts at the next step."""
        self._cycle_start, self._paused = None, 0.0

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Something the ranks do together inside the cycle (a rebalancing's gather): its time is
        waiting, not the rank's own, and the cycle goes on around it."""
        start = self._now()
        try:
            yield
        finally:
            self._paused += self._now() - start

    def last_bucket_ready(self, device: torch.device | None = None) -> None:
        """Every gradient of this step is computed: stretch the compute by the slowdown, note the time."""
        self.device = device if device is not None else self.device
        self._synchronize()
        if self._step_start is None:
            self._step_start = self._now()
        if self._cycle_start is None:
            self._cycle_start = self._step_start
        self.slept += stretch(self._now() - self._step_start, self.slowdown, self._sleep)
        self._ready = self._now()

    def backward_done(self) -> tuple[float, float] | None:
        """``(own_s, wait_s)`` of the cycle whose all-reduce just ended, or ``None`` when this backward
        exchanged nothing (an accumulating batch). The next cycle starts now."""
        if self._ready is None or self._cycle_start is None:
            return None
        self._synchronize()
        end = self._now()
        own, wait = self._ready - self._cycle_start - self._paused, end - self._ready + self._paused
        self._cycle_start, self._step_start, self._ready, self._paused = end, None, None, 0.0
        return own, wait


def timed_sum_hook(clock, bucket):  # annotations would be strings here, and DDP checks the real ones
    """DDP communication hook: sum ``bucket`` across ``clock.group``; its last bucket ends the rank's own time.

    Register it with ``ddp_model.register_comm_hook(clock, timed_sum_hook)`` (any device and backend).
    Returns a ``torch.futures.Future`` of the summed bucket.
    """
    buffer = bucket.buffer()
    if bucket.is_last():
        clock.last_bucket_ready(buffer.device)
    return all_reduce_future(buffer, clock.group)
