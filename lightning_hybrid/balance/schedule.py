"""The schedule of shares: which share of the global batch each rank takes at each training step.

Steps are ``(epoch, step)`` pairs, ordered as tuples, so a change keyed past an epoch's last step
takes effect at the next epoch's first. A DataLoader draws batch indices ahead of training (its
workers' prefetch, Lightning's fetcher), so a change decided at step ``t`` cannot take effect at
``t + 1`` on its own: each process's schedule records how far its sampler has dealt
(:attr:`ShareSchedule.frontier`), the ranks exchange their frontiers when they decide, and the
change takes effect at :func:`agreed_start`, the first step that no rank has dealt yet. A change at
a step this process has already dealt is refused, so a disagreement cannot pass silently.

Example::

    >>> schedule = ShareSchedule([16, 16])
    >>> schedule.dealt(0, 0); schedule.dealt(0, 1)        # the sampler dealt steps 0 and 1
    >>> schedule.change(agreed_start([schedule.frontier, (0, 1)]), [8, 24])
    >>> schedule.shares_at(0, 1), schedule.shares_at(0, 2), schedule.shares_at(1, 0)
    ((16, 16), (8, 24), (8, 24))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: A training step: (epoch, index of the global batch within the epoch).
Step = tuple[int, int]


def agreed_start(frontiers: Sequence[Step]) -> Step:
    """Where a change decided now takes effect on every rank: the first step none of the ranks'
    samplers has dealt yet (their :attr:`ShareSchedule.frontier`, gathered at the same training step)."""
    return max(tuple(int(v) for v in f) for f in frontiers)


class ShareSchedule:
    """The shares of each rank (sample counts summing to the global batch) in force at each step.

    Starts with ``shares`` at ``(0, 0)``; :meth:`change` adds later ones. Every process keeps its
    own copy and applies the same changes, decided from data all ranks gathered.
    """

    def __init__(self, shares: Sequence[int]) -> None:
        first = self._checked(shares, world_size=None, global_batch=None)
        self._changes: list[tuple[Step, tuple[int, ...]]] = [((0, 0), first)]
        #: The first step this process's sampler has not dealt yet.
        self.frontier: Step = (0, 0)

    @staticmethod
    def _checked(shares: Sequence[int], world_size: int | None, global_batch: int | None) -> tuple[int, ...]:
        values = tuple(int(s) for s in shares)
        if not values or any(s < 1 or s != raw for s, raw in zip(values, shares)):
            raise ValueError(f"shares must be positive whole numbers of samples, one per rank; got {list(shares)}")
        if world_size is not None and len(values) != world_size:
            raise ValueError(f"shares {list(values)} are not one per rank ({world_size} ranks)")
        if global_batch is not None and sum(values) != global_batch:
            raise ValueError(f"shares {list(values)} do not sum to the global batch {global_batch}")
        return values

    @property
    def world_size(self) -> int:
        return len(self._changes[0][1])

    @property
    def global_batch(self) -> int:
        return sum(self._changes[0][1])

    @property
    def latest(self) -> tuple[int, ...]:
        """The shares of the last change (in force now or pending)."""
        return self._changes[-1][1]

    @property
    def changes(self) -> list[tuple[Step, tuple[int, ...]]]:
        """``(start step, shares)`` of each change kept, the first at ``(0, 0)`` or the compacted base."""
        return list(self._changes)

    def shares_at(self, epoch: int, step: int) -> tuple[int, ...]:
        """The shares in force at ``(epoch, step)``."""
        key, found = (epoch, step), self._changes[0][1]
        for start, shares in self._changes:
            if start > key:
                break
            found = shares
        return found

    def dealt(self, epoch: int, step: int) -> None:
        """This process's sampler has dealt ``(epoch, step)``."""
        self.frontier = max(self.frontier, (epoch, step + 1))

    def change(self, start: Step, shares: Sequence[int]) -> None:
        """From ``start`` on, the ranks take ``shares``.

        Raises a RuntimeError when this process has already dealt ``start`` (it would have used the old
        shares there while another rank might use the new ones)."""
        start = (int(start[0]), int(start[1]))
        if start < self.frontier:
            raise RuntimeError(
                f"the shares cannot change from epoch {start[0]} step {start[1]}: this process has already dealt "
                f"the batches up to epoch {self.frontier[0]} step {self.frontier[1] - 1}; a change must start at "
                "agreed_start() of every rank's frontier"
            )
        if start < self._changes[-1][0]:
            raise ValueError(f"changes come in order: {start} is before the last change at {self._changes[-1][0]}")
        new = self._checked(shares, self.world_size, self.global_batch)
        if start == self._changes[-1][0]:
            self._changes[-1] = (start, new)
        else:
            self._changes.append((start, new))

    def compact(self, before: Step) -> None:
        """Forget the changes superseded before step ``before`` (keeps what is in force there and later)."""
        while len(self._changes) > 1 and self._changes[1][0] <= before:
            self._changes.pop(0)

    def state_dict(self) -> dict[str, Any]:
        return {"changes": [[epoch, step, list(shares)] for (epoch, step), shares in self._changes]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        changes = [((int(e), int(k)), self._checked(s, None, None)) for e, k, s in state["changes"]]
        if not changes or any(len(s) != len(changes[0][1]) or sum(s) != sum(changes[0][1]) for _, s in changes):
            raise ValueError(f"a saved share schedule must be changes of one world size and global batch; got {state}")
        self._changes = changes
