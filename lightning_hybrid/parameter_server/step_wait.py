"""Whether a worker waits for the next optimizer step before it gets parameters back (plain Python).

With staleness > 0 a push that does not complete an update (see
:mod:`~lightning_hybrid.parameter_server.update_rule`) is usually answered at once, with the
parameters as they are: the worker's next gradient is then one step stale. When the other workers
keep pace that costs accuracy for nothing, as the step is due a moment later. :class:`StepWaits`
holds such a reply until the step, but only while the pushes that complete it are expected soon:
within ``patience`` times the waiting worker's own cycle. Workers that keep pace then read fresh
parameters, as under BSP; a worker whose peers lag (a straggler among them) is answered at once and
holds nobody back. A held reply goes out at the step, at its deadline, or when a peer finishes its
epoch, whichever comes first.

A worker's cycle is what it costs its peers: from the moment the server replied to one of its
pushes until its next push arrives (loading the parameters and the next batch, the user's hooks
and callbacks, forward, backward), whatever made it slow. The time it waited for the server's
reply is not part of it, so a held reply never lengthens the cycle that decides how long to hold
(a feedback loop that would lock a fast worker to a straggler's pace). A global synchronization
(an epoch's or a segment's end, with validation after it) interrupts the cycles: the first push
after it is not measured.

Example::

    >>> waits = StepWaits(workers=2, patience=0.5)
    >>> for t in (0.0, 1.0, 2.0):
    ...     waits.pushed(0, t); waits.replied(0, t + 0.01)
    ...     waits.pushed(1, t + 0.1); waits.replied(1, t + 0.11)
    >>> waits.deadline(worker=0, needed=1, peers=[1], now=3.0)  # worker 1 is due at 3.1: wait
    3.5
    >>> waits.deadline(worker=0, needed=1, peers=[], now=3.0) is None  # nobody left to complete it
    True
"""

from __future__ import annotations

from collections.abc import Iterable


class StepWaits:
    """The cycles of ``workers`` workers and the replies held for the next step."""

    def __init__(self, workers: int, patience: float, smoothing: float = 0.3) -> None:
        if not patience >= 0:
            raise ValueError(f"step patience must be >= 0 (0: never wait), got {patience}")
        self.patience = float(patience)
        self.smoothing = smoothing
        self._replied: list[float | None] = [None] * workers  # when each worker's last reply went out
        self._cycle: list[float | None] = [None] * workers  # each worker's smoothed cycle, waiting excluded
        #: worker -> the time its held reply goes out at the latest
        self.held: dict[int, float] = {}

    def pushed(self, worker: int, now: float) -> None:
        """``worker``'s push arrived at ``now``: its cycle since the last reply ended."""
        replied, self._replied[worker] = self._replied[worker], None
        if replied is not None:
            cycle, previous = now - replied, self._cycle[worker]
            self._cycle[worker] = cycle if previous is None else previous + self.smoothing * (cycle - previous)

    def replied(self, worker: int, now: float) -> None:
        """The server sent ``worker`` its parameters at ``now``: its next cycle starts."""
        self._replied[worker] = now

    def synchronized(self) -> None:
        """A global synchronization: what the workers do next (validation, a new epoch) is not a cycle."""
        self._replied = [None] * len(self._replied)

    def cycle(self, worker: int) -> float | None:
        """``worker``'s smoothed cycle in seconds (None before one was measured)."""
        return self._cycle[worker]

    def deadline(self, worker: int, needed: int, peers: Iterable[int], now: float) -> float | None:
        """Until when ``worker`` should wait for the step that ``needed`` more pushes of ``peers``
        complete, or None when it should not wait (the pushes are not expected in time)."""
        own = self._cycle[worker]
        if self.patience == 0 or needed < 1 or own is None:
            return None
        expected = sorted(
            self._replied[p] + self._cycle[p] for p in peers if self._replied[p] is not None and self._cycle[p] is not None
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
