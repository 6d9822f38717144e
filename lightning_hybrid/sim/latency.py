"""Simulated network latency: a collective completes its message steps' round trips after its data does,
its caller not blocked meanwhile, as many at once on a process group as its backend runs.

On a long link (another data centre, another site) a collective takes round trips more than its bandwidth
explains. This kernel has no ``netem`` to add that delay to packets, so :class:`CollectiveLatency` adds it
where torch.distributed hands a collective back: a collective started with ``async_op=True`` returns at
once, as before, and its ``wait()`` (or its future) returns the collective's latency after its own
completion; a synchronous call returns that much later. Work that overlaps an asynchronous collective (a
delayed all-reduce's next steps, DDP's backward overlapping its buckets) therefore hides the latency as it
would on a real long link, and work that waits for it does not.

How much latency, and how many at once, is what gloo does through a real long link
(:class:`lightning_hybrid.sim.link.DelayedLink`, 2 ranks, measured with ``benchmarks/long_link.py``):

* **A round trip per message step.** gloo's transport sends a buffer only once the receiver has said it
  is ready for it, so each step of a collective's algorithm costs a round trip ``seconds``, not a one-way
  latency: a broadcast or a one-element all-reduce one (50.7 and 50.9 ms at a 50 ms round trip), a ring
  all-reduce of ``n`` ranks ``2 (n - 1)`` (reduce-scatter, then all-gather: 201.7 ms for 64 values at
  a 100 ms round trip; 410 ms for 250 KB at 200 ms back to back; in a training loop, 10 ms of compute
  between, 604 ms: TCP's window, which ``bytes_per_s`` stands for). :func:`~lightning_hybrid.comm.regime.round_trips`
  counts them.
* **Two at a time.** A process group runs at most :data:`~lightning_hybrid.comm.regime.IN_FLIGHT`
  collectives at once (gloo its two worker threads; NCCL one stream); a collective's latency starts when its data is in and a slot is free,
  and holds the slot until it completes: one, two and four 250 KB all-reduces started together took 410,
  419 and 827 ms at a 200 ms round trip.

NCCL's counts (one stream; a step a one-way latency, no rendezvous) follow its ring's design and are not
measured here (no GPU).

:meth:`CollectiveLatency.install` puts the delay on the collectives called through
``torch.distributed`` (:data:`DELAYED`) in this process: the package's own (whose collectives all go
through :mod:`lightning_hybrid.comm.collectives`), Lightning's (``sync_dist``, barriers, the per-batch
SIGTERM broadcast) and torch's communication hooks (PowerSGD: two all-reduces in sequence). DDP's default
bucket all-reduce runs in C++ and is reached through a communication hook, :func:`latent_allreduce_hook`.
Point-to-point messages (the pipeline's activations, the parameter server's channel) are not delayed.

Example (inside an initialized process group of 2 gloo ranks)::

    >>> latency = CollectiveLatency(0.05).install()                 # doctest: +SKIP
    >>> work = torch.distributed.all_reduce(t, async_op=True)       # returns at once
    >>> work.wait()                                                 # 2 x 50 ms after the sum is in
    >>> latency.uninstall()
"""

from __future__ import annotations

import functools
import heapq
import inspect
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from lightning_hybrid.comm.collectives import all_reduce_future
from lightning_hybrid.comm.regime import IN_FLIGHT, round_trips, sent_bytes

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


def delayed(future: torch.futures.Future, seconds: float | Callable[[float], float]) -> torch.futures.Future:
    """A future with ``future``'s value (or error) that completes ``seconds`` after ``future`` does (or at
    ``seconds(t)``, given the time ``t`` it did)."""
    late: torch.futures.Future = torch.futures.Future()

    def due() -> float:
        now = time.monotonic()
        return seconds(now) if callable(seconds) else now + seconds

    def complete(done: torch.futures.Future) -> None:
        try:
            value = done.value()
        except Exception as error:  # the collective failed (a peer died): say so at the same time
            _TIMER.at(due(), lambda: late.set_exception(error))
            return
        _TIMER.at(due(), lambda: late.set_result(value))

    future.add_done_callback(complete)
    return late


class CollectiveLatency:
    """The round trips of every collective of :data:`DELAYED` added to its completion, as many at once as
    the group's backend runs (see the module docstring).

    Args:
        seconds: the link's round trip (non-negative); a collective waits
            :func:`~lightning_hybrid.comm.regime.round_trips` of them.
        in_flight: collectives of one process group whose latencies run at once (the rest wait for a slot);
            None: the group's backend's (:data:`~lightning_hybrid.comm.regime.IN_FLIGHT`); 0: unlimited (every latency at once).
        bytes_per_s: the link's rate for a collective's messages: each waits also the bytes a rank sends
            in it (a ring all-reduce ``2 (n - 1) / n`` of the tensor) over this rate; None: no such term.
            Through a long link TCP's window makes a message of a few hundred KB cost more than its round
            trip: ``benchmarks/long_link.py`` fits this rate to the line's all-reduce of the model.
    """

    def __init__(self, seconds: float, in_flight: int | None = None, bytes_per_s: float | None = None) -> None:
        if not seconds >= 0:
            raise ValueError(f"collective latency must be non-negative seconds, got {seconds}")
        if in_flight is not None and in_flight < 0:
            raise ValueError(f"in_flight is a number of collectives (0: unlimited), got {in_flight}")
        if bytes_per_s is not None and not bytes_per_s > 0:
            raise ValueError(f"bytes_per_s is a positive rate (or None: no bandwidth term), got {bytes_per_s}")
        self.seconds = float(seconds)
        self.in_flight = in_flight
        self.bytes_per_s = bytes_per_s
        self._originals: dict[str, Callable[..., Any]] = {}
        self._slots: dict[Any, list[float]] = {}  # a group's slots: when each is free again
        self._slots_lock = threading.Lock()
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

    def slots(self, group: Any) -> int:
        """Latencies ``group`` runs at once (0: unlimited)."""
        if self.in_flight is not None:
            return self.in_flight
        try:
            return IN_FLIGHT.get(str(dist.get_backend(group)), 0)
        except (RuntimeError, ValueError):  # not a group of this process
            return 0

    def latency(self, name: str, group: Any, numel: int | None, element_size: int = 4) -> float:
        """Seconds collective ``name`` of ``group`` over ``numel`` values takes on the link."""
        backend, ranks = str(dist.get_backend(group)), dist.get_world_size(group)
        seconds = self.seconds * round_trips(name, ranks, numel, backend)
        if self.bytes_per_s is not None and numel:
            seconds += sent_bytes(name, ranks, numel * element_size) / self.bytes_per_s
        return seconds

    def due(self, group: Any, ready: float, latency: float) -> float:
        """When a collective of ``group`` whose data is in at ``ready`` completes: its ``latency`` starts in
        the first slot free (at ``ready`` or later) and holds it."""
        count = self.slots(group)
        if not count:
            return ready + latency
        with self._slots_lock:
            free = self._slots.setdefault(group, [0.0] * count)
            first = min(range(count), key=free.__getitem__)
            free[first] = max(ready, free[first]) + latency
            return free[first]

    def _latent(self, collective: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(collective)
        name = collective.__name__

        @functools.wraps(collective)
        def latent(*args: Any, async_op: bool = False, **kwargs: Any) -> Any:
            bound = signature.bind_partial(*args, **kwargs).arguments
            group = bound.get("group")
            tensor = bound.get("tensor")
            latency = self.latency(name, group, *((tensor.numel(), tensor.element_size())
                                                   if isinstance(tensor, torch.Tensor) else (None,)))
            work = collective(*args, async_op=True, **kwargs)
            self.delayed += 1
            late = delayed(work.get_future(), lambda ready: self.due(group, ready, latency))
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
