"""When may a worker start its next iteration? The clock logic of SSP, free of any transport.

The parameter server feeds this controller the events it receives (a worker finished an
iteration, a worker finished its epoch) and the controller answers which workers may go on. It is
pure Python, so every rule can be unit-tested without processes:

* ``staleness == 0``: bulk-synchronous. Every active worker's gradient of a round is collected and
  averaged into one update; then all go on together (the same as DDP).
* ``mode == "delay"`` (Zhang et al. 2017, paper 000): workers run freely until the fastest is
  ``staleness`` iterations ahead of the slowest. Then every worker stops after its current
  iteration; when all have stopped there is a global synchronization (all hold the same
  parameters) and the clocks are counted afresh.
* ``mode == "bounded"`` (Ho et al. 2013, stale synchronous parallel): a worker that has completed
  ``c`` iterations may start the next only while the slowest active worker has completed at least
  ``c - staleness``. The clocks are never reset within an epoch.
* ``staleness == inf``: fully asynchronous; nobody ever waits.

A worker that has finished its epoch (the data ran out) is no longer *active*: it cannot hold the
others back. A worker that is lost (its process died, :meth:`SyncController.remove`) is neither
active nor *live*: nobody waits for it again, and each new epoch starts with the live workers. The *gap* recorded for an iteration is, when a worker is allowed to start it, how
many iterations that worker has completed beyond the slowest active worker; it never exceeds
``staleness``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SYNC_MODES = ("delay", "bounded")


def validate_staleness(staleness: float | int | str, sync: str) -> float:
    """The staleness as a float (``inf`` allowed), or a ValueError saying what is wrong."""
    if isinstance(staleness, str):
        try:
            # YAML spells infinity ".inf"; Python's float() does not read that spelling.
            staleness = float(staleness.replace(".inf", "inf") if staleness.lstrip("+").startswith(".inf") else staleness)
        except ValueError:
            raise ValueError(f"staleness must be a non-negative integer or inf, got {staleness!r}") from None
    if isinstance(staleness, bool) or not isinstance(staleness, (int, float)):
        raise ValueError(f"staleness must be a non-negative integer or inf, got {staleness!r}")
    if math.isnan(staleness) or staleness < 0 or (math.isfinite(staleness) and staleness != int(staleness)):
        raise ValueError(f"staleness must be a non-negative integer or inf, got {staleness!r}")
    if sync not in SYNC_MODES:
        raise ValueError(f"unknown sync mode {sync!r}; choose 'delay' (Zhang et al. 2017) or 'bounded' (Ho et al. 2013)")
    return float(staleness)


@dataclass
class Decision:
    """What the server does after an event: which held workers to release, and how."""

    release: list[int] = field(default_factory=list)
    #: The held workers are released by a global synchronization (delay mode) or a completed round (BSP).
    global_sync: bool = False
    #: BSP only: apply the average of the round's gradients before releasing.
    apply_round: bool = False


class SyncController:
    """Clock bookkeeping for ``num_workers`` workers under one of the rules in the module docstring."""

    def __init__(self, num_workers: int, staleness: float, mode: str = "delay") -> None:
        if num_workers < 1:
            raise ValueError(f"need at least one worker, got {num_workers}")
        self.staleness = validate_staleness(staleness, mode)
        self.mode = mode
        self.num_workers = num_workers
        self.bsp = self.staleness == 0
        self.max_gap = 0
        self.global_syncs = 0
        self.live = set(range(num_workers))
        self.new_epoch()

    def new_epoch(self) -> None:
        """All live workers active again, clocks at zero (after the epoch's global synchronization)."""
        self.clocks = [0] * self.num_workers
        self.active = set(self.live)
        self.held: set[int] = set()
        self.sync_pending = False

    def remove(self, worker: int) -> Decision:
        """``worker`` is lost: it neither holds the others back nor is released again."""
        self.live.discard(worker)
        self.active.discard(worker)
        self.held.discard(worker)
        return self._settle()

    def _min_active_clock(self) -> int:
        return min(self.clocks[w] for w in self.active) if self.active else 0

    def _may_start(self, worker: int) -> bool:
        return self.clocks[worker] - self._min_active_clock() <= self.staleness

    def _record_release(self, workers: list[int]) -> None:
        floor = self._min_active_clock()
        for w in workers:
            if w in self.active:
                self.max_gap = max(self.max_gap, self.clocks[w] - floor)

    def gap(self, worker: int) -> int:
        """How many iterations ``worker`` has completed beyond the slowest active worker."""
        return self.clocks[worker] - self._min_active_clock()

    def _release_all_held(self, **flags: bool) -> Decision:
        released = sorted(self.held)
        self.held.clear()
        if flags.get("global_sync"):
            self.global_syncs += 1
            self.sync_pending = False
            if self.mode == "delay" and not self.bsp:
                for w in self.active:
                    self.clocks[w] = 0
        self._record_release(released)
        return Decision(release=released, **flags)

    def _settle(self) -> Decision:
        """Release whoever may go on now."""
        if not self.held:
            return Decision()
        if self.bsp:
            if self.held >= self.active:
                return self._release_all_held(global_sync=True, apply_round=True)
            return Decision()
        if self.mode == "delay":
            if self.sync_pending and self.held >= self.active:
                return self._release_all_held(global_sync=True)
            return Decision()
        # bounded: release each held worker whose bound now holds
        ready = sorted(w for w in self.held if self._may_start(w))
        self.held.difference_update(ready)
        self._record_release(ready)
        return Decision(release=ready)

    def push(self, worker: int) -> Decision:
        """``worker`` finished an iteration (its gradient was received); it waits for the decision."""
        if worker not in self.active:
            raise RuntimeError(f"worker {worker} pushed a gradient after finishing its epoch")
        self.clocks[worker] += 1
        self.held.add(worker)
        if self.bsp:
            return self._settle()
        if math.isinf(self.staleness):
            return self._settle_single(worker)
        if self.mode == "delay" and not self.sync_pending and self.gap(worker) >= self.staleness:
            self.sync_pending = True
        if self.mode == "delay" and not self.sync_pending:
            return self._settle_single(worker)
        return self._settle()

    def _settle_single(self, worker: int) -> Decision:
        self.held.discard(worker)
        self._record_release([worker])
        return Decision(release=[worker])

    def finish(self, worker: int) -> Decision:
        """``worker`` has no more data this epoch; it no longer holds the others back."""
        self.active.discard(worker)
        self.held.discard(worker)
        return self._settle()

    @property
    def all_finished(self) -> bool:
        return not self.active
