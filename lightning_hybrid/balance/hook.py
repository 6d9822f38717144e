"""The DDP communication hook of balanced data parallelism, and the clock that splits a step into
this rank's compute and its wait for the others.

Gradients: each rank's loss is already weighted by its share of the global batch (the strategy
multiplies it by ``samples / global samples``), so :func:`timed_sum_hook` sums each gradient bucket
across the ranks, where DDP's default hook averages: the sum is the mean gradient over the global
batch, one step of single-process SGD on it.

Timing (:class:`ComputeClock`): ``start()`` when an optimizer step's first batch starts; the last
gradient bucket becoming ready is the end of this rank's compute (its backward has produced every
gradient; on CUDA the clock waits for the device first); the rest, until the backward returns with
the all-reduce done, is waiting for the slower ranks. A simulated slowdown sleeps ``(factor - 1) x``
the compute right there, before the last bucket's all-reduce starts, so the measurement sees the
slower speed and the other ranks really wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from lightning_hybrid.comm.collectives import all_reduce_future
from lightning_hybrid.sim.slowdown import stretch


class ComputeClock:
    """The state :func:`timed_sum_hook` is registered with: one rank's step timing.

    Args:
        slowdown: simulated slowdown factor of this rank's compute (>= 1).
        group: the process group the buckets are summed over (``None``: the default group).
        now, sleep: the clock and the sleep (replaceable in tests).
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
        self._start: float | None = None
        self._ready: float | None = None
        #: Seconds slept for the simulated slowdown, over the whole run.
        self.slept = 0.0

    def _synchronize(self) -> None:
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the kernels launched so far have run

    def start(self) -> None:
        """An optimizer step's first batch starts."""
        self._start, self._ready = self._now(), None

    def last_bucket_ready(self, device: torch.device | None = None) -> None:
        """Every gradient of this step is computed: stretch the compute by the slowdown, note the time."""
        self.device = device if device is not None else self.device
        self._synchronize()
        if self._start is None:
            self._start = self._now()
        self.slept += stretch(self._now() - self._start, self.slowdown, self._sleep)
        self._ready = self._now()

    def backward_done(self) -> tuple[float, float] | None:
        """``(compute_s, wait_s)`` of the step whose all-reduce just ended, or ``None`` when this
        backward exchanged nothing (an accumulating batch)."""
        if self._ready is None or self._start is None:
            return None
        self._synchronize()
        compute, wait = self._ready - self._start, self._now() - self._ready
        self._start = self._ready = None
        return compute, wait


def timed_sum_hook(clock, bucket):  # annotations would be strings here, and DDP checks the real ones
    """DDP communication hook: sum ``bucket`` across ``clock.group``; its last bucket ends the rank's compute.

    Register it with ``ddp_model.register_comm_hook(clock, timed_sum_hook)`` (any device and backend).
    Returns a ``torch.futures.Future`` of the summed bucket.
    """
    buffer = bucket.buffer()
    if bucket.is_last():
        clock.last_bucket_ready(buffer.device)
    return all_reduce_future(buffer, clock.group)
