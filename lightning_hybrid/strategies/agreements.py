"""How the ranks agree on a stop before a training batch, one class a way (the meeting point that calls
them is :class:`lightning_hybrid.strategies.meeting.BatchMeeting`): :class:`EveryBatch` (a MAX all-reduce
each batch), :class:`Deferred` (started each batch, read ``lag`` batches later), :class:`Carried` (on the
strategy's own exchanges) and :class:`ThroughServer` (told to a parameter server)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

import torch
import torch.distributed as dist

from lightning_hybrid.comm.collectives import Pending, all_reduce_, start_all_reduce, unchecked_group


class Agreement(Protocol):
    """How the ranks agree on a stop: called before each training batch with this rank's requested
    signal (0: none), it returns the signal every rank stops on (0: go on)."""

    def __call__(self, requested: int) -> int: ...



class EveryBatch:
    """A MAX all-reduce of the ranks' requested signals before each batch, on the default group."""

    def __call__(self, requested: int) -> int:
        return int(all_reduce_(torch.tensor([requested]), op=dist.ReduceOp.MAX).item())



class Deferred:
    """Each batch starts the MAX all-reduce of this batch's requests in the background (a gloo group of
    its own, CPU tensors) and reads the one started ``lag`` batches earlier, long done by then: every
    rank stops at the same batch, ``lag`` batches after the request, and nobody waits there."""

    def __init__(self, lag: int = 1) -> None:
        if lag < 1:
            raise ValueError(f"lag must be at least one batch, got {lag}")
        self.lag = lag
        self._pending: deque[Pending] = deque()
        self.group = unchecked_group()  # every rank creates it, in setup; in the background even under a check

    def __call__(self, requested: int) -> int:
        agreed = 0
        if len(self._pending) >= self.lag:
            agreed = int(self._pending.popleft().wait().item())
        if agreed:
            self._pending.clear()  # every rank leaves the same ones unread
        else:
            self._pending.append(start_all_reduce(torch.tensor([requested]), self.group, op=dist.ReduceOp.MAX))
        return agreed



class Carried:
    """Ranks that meet only at their exchanges (the delayed all-reduce, local SGD): no collective of its
    own. The strategy sends this rank's request (:attr:`requested`, kept up to date before each batch)
    with its next exchange, in the exchanged buffer (:mod:`lightning_hybrid.comm.stop_signal`), and
    reads the signal the exchange carried back (:meth:`heard`) when it applies it: the same step on
    every rank, up to the exchange's delay after the request."""

    def __init__(self) -> None:
        self.requested = 0
        self.agreed = 0

    def __call__(self, requested: int) -> int:
        self.requested = requested
        return self.agreed

    def heard(self, signum: int) -> None:
        """An applied exchange carried ``signum`` (0: no request)."""
        self.agreed = max(self.agreed, int(signum))



class ThroughServer:
    """Workers that do not meet between sync points (a parameter server's): this rank stops on its
    own request at once, after telling the server (``tell(signum)``), whose reply to every worker's
    next exchange then says so: each stops there, the ones waiting for their peers included."""

    def __init__(self, tell: Callable[[int], None]) -> None:
        self.tell = tell
        self._told = False

    def __call__(self, requested: int) -> int:
        if requested and not self._told:
            self._told = True
            self.tell(requested)
        return requested
