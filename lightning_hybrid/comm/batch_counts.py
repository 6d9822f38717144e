"""Each rank's count of training batches between two sync points, compared on the run's store before the
sync point issues any collective: ranks whose data ran out at different batches end with one error that
names every rank's count, never with a collective matched with another (or waited for forever).

Ranks that exchange in the background (the delayed all-reduce, local SGD) must meet at a sync point
having issued the same exchanges. When one rank's data ends earlier (an ``IterableDataset`` whose shards
differ, ``use_distributed_sampler=False``), the other's next exchange has no partner: its all-reduce
would wait forever, or meet the first rank's sync-point broadcast. :class:`BatchCounts` prevents it:

* each rank counts its training batches (:meth:`BatchCounts.count`);
* at a sync point, before any collective, it posts its count on the run's store
  (:class:`~lightning_hybrid.comm.board.Board`) and waits for every rank's (:meth:`BatchCounts.agree`):
  equal counts go on; different ones raise :class:`UnevenBatchesError` on every rank;
* a rank that waits for an exchange looks at the board while it waits (:meth:`BatchCounts.check_peers`,
  called by the exchange's ``while_waiting``): a peer that ended its data before this rank's current
  batch will never join; this rank posts where it is and raises, and so does the peer, reading it.

The store is not a collective: it is read and written without every rank's participation, so the check
itself cannot desynchronise the ranks. Plain Python and torch.distributed's store; no Lightning.
"""

from __future__ import annotations

from lightning_hybrid.comm.board import Board

#: What a rank posts, before its count so far, when it stops inside its data because a peer's ended.
STILL_TRAINING = "training:"


class UnevenBatchesError(ValueError):
    """The ranks' training data gave different numbers of batches between two sync points."""


class BatchCounts:
    """Training batches this rank took since the last sync point, compared with the other ranks' (see the
    module docstring).

    Args:
        rank, world_size: this rank and how many there are.
        board: the run's store, under a prefix of this fit's own.
        timeout_s: how long :meth:`agree` waits for a rank that posts nothing (a rank stuck elsewhere).
        fix: what to tell the user to change, appended to the error.
    """

    def __init__(self, rank: int, world_size: int, board: Board, timeout_s: float = 1800.0, fix: str = "") -> None:
        self.rank, self.world_size, self.board = rank, world_size, board
        self.timeout_s, self.fix = timeout_s, fix
        #: Batches since the last sync point.
        self.batches = 0
        self._syncs = 0  # sync points agreed so far: the key of the next one

    def count(self, batches: int = 1) -> None:
        """Another training batch (or ``batches``) on this rank."""
        self.batches += batches

    def _key(self, rank: int) -> str:
        return f"{self._syncs}/{rank}"

    def agree(self) -> None:
        """At a sync point, before any collective: post this rank's count, wait for every rank's; raise
        :class:`UnevenBatchesError` where they differ (on every rank), else start counting anew."""
        self.board.post(self._key(self.rank), str(self.batches))
        keys = [self._key(r) for r in range(self.world_size)]
        posted = self.board.wait_for(keys, self.timeout_s)
        if len(posted) < self.world_size:
            missing = [r for r in range(self.world_size) if self._key(r) not in posted]
            raise UnevenBatchesError(
                f"rank {self.rank} reached a sync point after {self.batches} training batches and waited "
                f"{self.timeout_s:g} s for rank(s) {', '.join(map(str, missing))}, which never reached it{self._fix()}"
            )
        counts = [posted[self._key(r)] for r in range(self.world_size)]
        if len(set(counts)) > 1:
            raise UnevenBatchesError(self._describe(counts))
        self.board.post(self._seen(self._syncs, self.rank), "1")  # read: the store's host may go (finish)
        self._syncs += 1
        self.batches = 0
        if self._syncs > 2:  # every rank has posted this sync point: none reads two sync points ago any more
            self.board.delete(f"{self._syncs - 3}/{self.rank}")
            self.board.delete(self._seen(self._syncs - 3, self.rank))

    @staticmethod
    def _seen(sync: int, rank: int) -> str:
        return f"{sync}/seen{rank}"

    def finish(self, timeout_s: float = 30.0) -> None:
        """At the fit's end, on every rank: the rank whose process holds the store (global rank 0) waits
        until every rank has read the last sync point's counts. Else it could end, and its store with it,
        while a rank's read is still on its way through a long link (a 200 ms round trip: the peer's read
        failed with "Connection was likely closed")."""
        if self.rank == 0 and self._syncs:
            self.board.wait_for([self._seen(self._syncs - 1, r) for r in range(self.world_size)], timeout_s)

    def check_peers(self) -> None:
        """While this rank waits for an exchange: raise :class:`UnevenBatchesError` if a peer posted the end
        of its data before this rank's current batch (it will never join this exchange), after posting
        where this rank is, so that the peer names it too."""
        for rank in range(self.world_size):
            if rank == self.rank:
                continue
            posted = self.board.read(self._key(rank))
            if posted is not None and not posted.startswith(STILL_TRAINING) and self.batches > int(posted):
                self.board.post(self._key(self.rank), f"{STILL_TRAINING}{self.batches}")
                counts = [self.board.read(self._key(r)) or "?" for r in range(self.world_size)]
                raise UnevenBatchesError(self._describe(counts))

    def _describe(self, counts: list[str]) -> str:
        said = ", ".join(f"rank {r}: " + (f"{c.removeprefix(STILL_TRAINING)} or more" if c.startswith(STILL_TRAINING) else c)
                         for r, c in enumerate(counts))
        return (f"the ranks' training data gave different numbers of batches before sync point {self._syncs + 1} "
                f"(an epoch's end or a validation) ({said}); every rank must train the same number of batches "
                f"between sync points{self._fix()}")

    def _fix(self) -> str:
        return f": {self.fix}" if self.fix else ""

