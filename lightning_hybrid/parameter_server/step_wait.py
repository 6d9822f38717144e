"""Whether a worker waits for the next optimizer step before it gets parameters back (plain Python).

With staleness > 0 a push that does not complete an update (see
:mod:`~lightning_hybrid.parameter_server.update_rule`) is usually answered at once, with the
parameters as they are: the worker's next gradient is then one step stale. When the other workers
keep pace that costs accuracy for nothing, as the step is due a moment later. :class:`StepWaits`
holds such a reply until the step, but only while the pushes that complete it are expected soon:
within ``patience`` times the waiting worker's own push interval, judged from each worker's recent
push intervals. Workers that keep pace then read fresh parameters, as under BSP; a worker whose
peers lag (a straggler among them) is answered at once and holds nobody back. A held reply goes out
at the step, at its deadline, or when a peer finishes its epoch, whichever comes first.

Example::

    >>> waits = StepWaits(workers=2, patience=0.5)
    >>> for t in (0.0, 1.0, 2.0):
    ...     waits.pushed(0, t); waits.pushed(1, t + 0.1)
    >>> waits.deadline(worker=0, needed=1, peers=[1], now=3.0)  # worker 1 is due at 3.1: wait
    3.5
    >>> waits.deadline(worker=0, needed=1, peers=[], now=3.0) is None  # nobody left to complete it
    True
"""

from __future__ import annotations

from collections.abc import Iterable


class StepWaits:
    """Push intervals of ``workers`` workers and the replies held for the next step."""

    def __init__(self, workers: int, patience: float, smoothing: float = 0.3) -> None:
        if not patience >= 0:
            raise ValueError(f"step patience must be >= 0 (0: never wait), got {patience}")
        self.patience = float(patience)
        self.smoothing = smoothing
        self._last: list[float | None] = [None] * workers
        self._interval: list[float | None] = [None] * workers
        #: worker -> the time its held reply goes out at the latest
        self.held: dict[int, float] = {}

    def pushed(self, worker: int, now: float) -> None:
        """``worker``'s push arrived at ``now``."""
        last = self._last[worker]
        if last is not None:
            gap = now - last
            previous = self._interval[worker]
            self._interval[worker] = gap if previous is None else previous + self.smoothing * (gap - previous)
        self._last[worker] = now

    def deadline(self, worker: int, needed: int, peers: Iterable[int], now: float) -> float | None:
        """Until when ``worker`` should wait for the step that ``needed`` more pushes of ``peers``
        complete, or None when it should not wait (the pushes are not expected in time)."""
        own = self._interval[worker]
        if self.patience == 0 or needed < 1 or own is None:
            return None
        expected = sorted(
            self._last[p] + self._interval[p] for p in peers if self._last[p] is not None and self._interval[p] is not None
        )
        if len(expected) < needed:
            return None
        limit = now + self.patience * own
        return limit if expected[needed - 1] <= limit else None

    def due(self, now: float) -> list[int]:
        """The held workers whose deadline has passed (no longer held)."""
        due = sorted(w for w, t in self.held.items() if t <= now)
        for w in due:
            del self.held[w]
        return due

    def release_all(self) -> list[int]:
        """Every held worker (no longer held)."""
        released = sorted(self.held)
        self.held.clear()
        return released

    def next_deadline(self) -> float | None:
        return min(self.held.values(), default=None)
