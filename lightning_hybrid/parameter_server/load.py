"""How busy the parameter server was: what tells whether one server process is the bottleneck.

The server measures itself (:class:`LoadMeter`) and reports at shutdown (:class:`ServerLoad`, in
the ``Bye`` reply), from the end of its first optimizer step on: the pushes it served, the steps it
took, its wall-clock time, the time it spent handling requests (the rest it waited for them), and
its CPU time (every thread: the request loop and the threads that receive into the mailbox). One
server is a bottleneck when its CPU time per push approaches a worker's time per push divided by the
number of workers: :meth:`ServerLoad.workers_to_saturate` gives the worker count at which it would
be busy all the time. Sharding the parameters over several server processes pays only near that
count.

Example::

    >>> load = ServerLoad(pushes=1000, steps=250, wall_s=10.0, busy_s=0.5, cpu_s=0.8)
    >>> round(load.cpu_ms_per_push, 2), round(load.busy_fraction, 3)
    (0.8, 0.05)
    >>> load.workers_to_saturate(worker_s_per_push=0.008)  # a worker computes a push in 8 ms
    10.0
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ServerLoad:
    """What one server did over a fit, after its first step (see the module docstring)."""

    pushes: int
    steps: int
    wall_s: float
    busy_s: float
    cpu_s: float

    @property
    def busy_fraction(self) -> float:
        """Share of the wall-clock time spent handling requests."""
        return self.busy_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def cpu_ms_per_push(self) -> float:
        """The server's CPU time per push, in milliseconds (0 without pushes)."""
        return 1e3 * self.cpu_s / self.pushes if self.pushes else 0.0

    def workers_to_saturate(self, worker_s_per_push: float) -> float:
        """Workers, each taking ``worker_s_per_push`` seconds per push, that would keep the server's
        CPU busy all the time (``inf`` when it used none)."""
        return worker_s_per_push / (self.cpu_s / self.pushes) if self.pushes and self.cpu_s > 0 else float("inf")

    def as_metrics(self, prefix: str = "server") -> dict[str, float]:
        """The fields and the derived figures as ``{prefix}/name`` floats (a metrics report's entries)."""
        values = {**asdict(self), "busy_fraction": self.busy_fraction, "cpu_ms_per_push": self.cpu_ms_per_push}
        return {f"{prefix}/{name}": float(value) for name, value in values.items()}

    @classmethod
    def combined(cls, shards: Sequence[ServerLoad]) -> ServerLoad:
        """The load of sharded servers together: shard 0's pushes and steps (every shard receives
        every push and takes the same steps), the longest wall-clock and busy times, the CPU time
        of all (so that :attr:`cpu_ms_per_push` is what a push costs all shards together)."""
        return cls(shards[0].pushes, shards[0].steps, max(s.wall_s for s in shards), max(s.busy_s for s in shards),
                   sum(s.cpu_s for s in shards))

    def describe(self) -> str:
        return (
            f"{self.pushes} pushes, {self.steps} steps in {self.wall_s:.1f} s; handling requests {self.busy_s:.2f} s "
            f"({100 * self.busy_fraction:.1f} %), CPU {self.cpu_s:.2f} s ({self.cpu_ms_per_push:.3f} ms per push)"
        )


class LoadMeter:
    """The server's side. It starts measuring when the first optimizer step is done: the start-up,
    the optimizer's arrival and the first step (whose lazy imports and allocations take about a
    second of CPU) are not the load of serving. From then on: pushes, steps, wall-clock and CPU time,
    and the time inside :meth:`handling`."""

    def __init__(self) -> None:
        self.started = False
        self.pushes = 0
        self.steps = 0
        self.busy_s = 0.0
        self._wall0 = self._cpu0 = self._busy_from = 0.0

    def pushed(self) -> None:
        """A push arrived."""
        self.pushes += self.started

    def stepped(self) -> None:
        """The server took an optimizer step."""
        if self.started:
            self.steps += 1
            return
        self.started = True
        self._wall0, self._cpu0 = time.monotonic(), time.process_time()
        self._busy_from = time.perf_counter()

    @contextmanager
    def handling(self) -> Iterator[None]:
        """Count the time inside as handling a request."""
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.started:
                self.busy_s += time.perf_counter() - max(start, self._busy_from)

    def report(self) -> ServerLoad:
        """What was measured (all zero when the server took no step)."""
        if not self.started:
            return ServerLoad(0, 0, 0.0, 0.0, 0.0)
        return ServerLoad(self.pushes, self.steps, time.monotonic() - self._wall0, self.busy_s,
                          time.process_time() - self._cpu0)
