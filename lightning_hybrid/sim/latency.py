"""Simulated network latency: every collective completes ``seconds`` after its data does, and its
caller is not blocked meanwhile.

On a long link (another data centre, another site) a collective's bytes take a round trip more to
arrive than its bandwidth explains. This kernel has no ``netem`` to add that delay to packets, so
:class:`CollectiveLatency` adds it where torch.distributed hands a collective back: a collective
started with ``async_op=True`` returns at once, as before, and its ``wait()`` (or its future) returns
``seconds`` after the collective's own completion; a synchronous call returns that much later. Work
that overlaps an asynchronous collective (a delayed all-reduce's next steps, DDP's backward
overlapping its buckets) therefore hides the latency as it would on a real long link, and work that
waits for it does not.

:meth:`CollectiveLatency.install` puts the delay on the collectives called through
``torch.distributed`` (:data:`DELAYED`) in this process: the package's own (whose collectives all go
through :mod:`lightning_hybrid.comm.collectives`), Lightning's (``sync_dist``, barriers) and torch's
communication hooks (PowerSGD: two all-reduces in sequence, two latencies). DDP's default bucket
all-reduce runs in C++ and is reached through a communication hook, :func:`latent_allreduce_hook`.
Point-to-point messages (the pipeline's activations, the parameter server's channel) are not delayed.

Example (inside an initialized process group)::

    >>> latency = CollectiveLatency(0.05).install()                 # doctest: +SKIP
    >>> work = torch.distributed.all_reduce(t, async_op=True)       # returns at once
    >>> work.wait()                                                 # 50 ms after the sum is in
    >>> latency.uninstall()
"""

from __future__ import annotations

import functools
import heapq
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from lightning_hybrid.comm.collectives import all_reduce_future

#: The torch.distributed collectives whose completion :meth:`CollectiveLatency.install` delays.
DELAYED = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "barrier")


class _Timer:
    """One daemon thread that completes futures at their due times (a heap of deadlines). Each completion
    runs in a thread of its own: a future's callbacks run where it is completed, and one may wait for a
    later collective of this timer (torch's PowerSGD hook waits inside its callbacks)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def at(self, due: float, action: Callable[[], None]) -> None:
        with self._wake:
            heapq.heappush(self._heap, (due, next(self._order), action))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="collective-latency", daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._wake.wait(None if not self._heap else max(self._heap[0][0] - time.monotonic(), 0.0))
                _, _, action = heapq.heappop(self._heap)
            threading.Thread(target=action, name="collective-latency-completion", daemon=True).start()


_TIMER = _Timer()


def delayed(future: torch.futures.Future, seconds: float) -> torch.futures.Future:
    """A future with ``future``'s value (or error) that completes ``seconds`` after ``future`` does."""
    late: torch.futures.Future = torch.futures.Future()

    def complete(done: torch.futures.Future) -> None:
        try:
            value = done.value()
        except Exception as error:  # the collective failed (a peer died): say so at the same time
            _TIMER.at(time.monotonic() + seconds, lambda: late.set_exception(error))
            return
        _TIMER.at(time.monotonic() + seconds, lambda: late.set_result(value))

    future.add_done_callback(complete)
    return late


class CollectiveLatency:
    """``seconds`` added to the completion of every collective of :data:`DELAYED` (see the module docstring).

    Args:
        seconds: the latency each collective's completion is delayed by (non-negative).
    """

    def __init__(self, seconds: float) -> None:
        if not seconds >= 0:
            raise ValueError(f"collective latency must be non-negative seconds, got {seconds}")
        self.seconds = float(seconds)
        self._originals: dict[str, Callable[..., Any]] = {}
        #: Collectives delayed so far in this process.
        self.delayed = 0

    @property
    def installed(self) -> bool:
        return bool(self._originals)

    def install(self) -> CollectiveLatency:
        """Delay this process's collectives from now on (idempotent)."""
        if self.installed or not self.seconds:
            return self
        for name in DELAYED:
            original = getattr(dist, name, None)
            if original is not None:
                self._originals[name] = original
                setattr(dist, name, self._latent(original))
        return self

    def uninstall(self) -> None:
        """The collectives as torch.distributed has them."""
        for name, original in self._originals.items():
            setattr(dist, name, original)
        self._originals = {}

    def _latent(self, collective: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(collective)
        def latent(*args: Any, async_op: bool = False, **kwargs: Any) -> Any:
            work = collective(*args, async_op=True, **kwargs)
            self.delayed += 1
            late = delayed(work.get_future(), self.seconds)
            if not async_op:
                late.wait()
                return None
            return torch._C._distributed_c10d._create_work_from_future(late)

        return latent


def latent_allreduce_hook(group, bucket):  # noqa: ANN001, ANN201 (DDP checks the annotations, as objects)
    """A DDP communication hook doing what DDP does by default (each bucket summed across ``group`` and
    divided by its size) through ``torch.distributed.all_reduce``, so that an installed
    :class:`CollectiveLatency` delays it. ``group``: the hook's state (None: the default group)."""
    return all_reduce_future(bucket.buffer().div_(dist.get_world_size(group)), group)
