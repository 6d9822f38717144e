"""The fit's per-batch meeting point: where every rank agrees whether to stop, and what observes it.

Lightning ends a multi-process fit on SIGTERM in three places, each a hazard to a distributed run:
its handler broadcasts from inside the signal handler (a rank that is inside a collective when the
signal arrives then starts a second one, and the ranks wait for each other forever); before every
training batch it broadcasts rank 0's flag and waits for it (``_broadcast_sigterm_tensor``: rank 0
alone decides, so a signal that reaches another rank only is ignored there; and the broadcast is a
synchronization in every step, where a fast rank waits for the slowest before its compute even
under a strategy that lets it go on); and after every batch each rank checks its own flag.

:class:`BatchMeeting`, one per Trainer (:func:`meeting`), takes their place while it is attached
(:meth:`BatchMeeting.attach`, by the strategy or by the first callback that needs it, at setup):

* a signal only records what was asked (:meth:`BatchMeeting.request_stop`: an int stored, nothing
  logged, sent or computed in the handler);
* before each training batch every rank passes :meth:`BatchMeeting.__call__` (Lightning's per-batch
  hook), where the ranks agree on a stop as the strategy chose (:meth:`BatchMeeting.agree_by`):
  :class:`EveryBatch` (the default: a MAX all-reduce of the ranks' requested signals, the cost of
  Lightning's broadcast; a request on any rank stops every rank at the same batch, at an optimizer
  step's boundary under gradient accumulation), :class:`Deferred` (the all-reduce started each batch
  and read ``lag`` batches later: synchronous strategies and balanced shares, whose ranks must not wait
  for each other there), :class:`Carried` (the delayed all-reduce and local SGD, whose ranks meet only
  at their exchanges: the request rides on the next exchange), or :class:`ThroughServer` (the
  parameter-server workers, which never
  meet between sync points: a worker asked to stop tells the server, and every worker stops at its
  next exchange with it, :meth:`BatchMeeting.stop_now`);
* the agreed signal is the largest requested (SIGTERM over SIGUSR2 over SIGINT), so every rank knows
  which signal stopped the run, wherever it arrived;
* in validation and test loops, :meth:`BatchMeeting.agree_in_evaluation` agrees every
  :data:`EVALUATION_STRIDE` batches (:class:`Deferred`: a MAX all-reduce started there and read at the
  next, so that through a long link no evaluation batch waits a round trip for it; only where every rank
  runs the same number of batches, checked once per loop by :meth:`BatchMeeting.evaluation_starts`), and
  once more, waited for, at the loop's end (:meth:`BatchMeeting.evaluation_ends`);
* observers (:meth:`BatchMeeting.observe`) get the seconds each pass took: ranks that meet there
  wait there for the slowest (the straggler report reads it).

With one process there is nothing to agree: a request sets Lightning's own flag, checked after the
batch. Attached, the meeting holds Lightning's per-batch hook and its SIGTERM notifier (both restored
by :meth:`BatchMeeting.detach`); the Trainer's flag ``received_sigterm`` is set only once the ranks
agree.
"""

from __future__ import annotations

import signal
import time
import weakref
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.utilities.exceptions import SIGTERMException

from lightning_hybrid.comm.collectives import all_gather
from lightning_hybrid.strategies.agreements import Agreement, Deferred, EveryBatch, ThroughServer

#: An evaluation loop's ranks agree on a stop every this many batches (each agreement read at the next): its
#: batches are short, and a one-value all-reduce takes a round trip (50 ms through a long link, against
#: about 5 ms a test batch of LeNet-5), so that one at every batch made every batch wait for the link.
EVALUATION_STRIDE = 16

_HOOK = "_broadcast_sigterm_tensor"
_NOTIFIER = "_sigterm_notifier_fn"


def _distributed(trainer: pl.Trainer) -> bool:
    return trainer.world_size > 1 and dist.is_available() and dist.is_initialized()


class BatchMeeting:
    """The per-batch meeting point of one Trainer's fits (see the module docstring)."""

    def __init__(self, trainer: pl.Trainer) -> None:
        self._trainer = weakref.ref(trainer)
        self.agreement: Agreement = EveryBatch()
        #: The signal asked for on this rank (0: none): set by :meth:`request_stop`.
        self.requested = 0
        #: The signal every rank agreed to stop on (0: none yet).
        self.agreed = 0
        self._observers: list[Callable[[float], None]] = []
        self._evaluation_agrees = False
        self._evaluation_agreement: Deferred | None = None  # made at the first loop that agrees
        self._evaluation_world: Any = None  # the default group it was made in
        self._evaluation_batch = 0  # batches of the current evaluation loop so far
        self._attached = False

    @property
    def trainer(self) -> pl.Trainer:
        trainer = self._trainer()
        assert trainer is not None, "the Trainer of this meeting is gone"
        return trainer

    # ------------------------------------------------------------------ set-up
    def attach(self) -> BatchMeeting:
        """Take Lightning's per-batch hook and SIGTERM notifier for this Trainer (idempotent: the strategy
        and callbacks each call it at setup; a stop asked for before, during set-up, is kept)."""
        trainer = self.trainer
        setattr(trainer.fit_loop.epoch_loop, _HOOK, self)
        setattr(trainer._signal_connector, _NOTIFIER, self._on_lightning_sigterm)
        self._attached = True
        return self

    def detach(self) -> None:
        """Lightning's own hook and notifier again, and no stop asked for (after the fit or test)."""
        trainer = self._trainer()
        if trainer is None or not self._attached:
            return
        vars(trainer.fit_loop.epoch_loop).pop(_HOOK, None)
        vars(trainer._signal_connector).pop(_NOTIFIER, None)
        self._attached = False
        self.requested = self.agreed = 0
        self.agreement = EveryBatch()
        self._observers.clear()

    def agree_by(self, agreement: Agreement) -> None:
        """How this fit's ranks agree on a stop (the strategy's choice, at setup)."""
        self.agreement = agreement

    def observe(self, observer: Callable[[float], None]) -> None:
        """Call ``observer(seconds)`` after each pass of the training loop through the meeting."""
        if observer not in self._observers:
            self._observers.append(observer)

    def forget(self, observer: Callable[[float], None]) -> None:
        if observer in self._observers:
            self._observers.remove(observer)

    # ------------------------------------------------------------------ requests (signal handlers)
    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        """Ask every rank to stop after the current batch (safe inside a signal handler: it stores an int)."""
        if self.requested:
            return
        self.requested = int(signum)
        trainer = self._trainer()
        if trainer is not None and not _distributed(trainer):
            trainer._signal_connector.received_sigterm = True  # one process: Lightning checks after the batch

    def _on_lightning_sigterm(self, signum: int, frame: Any) -> None:
        """In place of Lightning's notifier (which broadcasts inside the handler): a request, nothing more."""
        self.request_stop(signum)

    # ------------------------------------------------------------------ the meetings
    def __call__(self) -> None:
        """Before each training batch (Lightning's per-batch hook, multi-process fits only)."""
        start = time.perf_counter()
        try:
            if not self.agreed:
                self.agreed = self.agreement(self.requested)
            if self.agreed and self._at_step_boundary():
                self._stop()
        finally:
            elapsed = time.perf_counter() - start
            for observer in self._observers:
                observer(elapsed)

    def _at_step_boundary(self) -> bool:
        """With gradient accumulation, only where an optimizer step has just been taken (a checkpoint
        there holds no half-accumulated gradients; every rank counts the same batches)."""
        if isinstance(self.agreement, ThroughServer):
            return True
        trainer = self.trainer
        accumulate = max(int(trainer.accumulate_grad_batches or 1), 1)
        return trainer.fit_loop.epoch_loop.batch_progress.current.completed % accumulate == 0

    def _stop(self) -> None:
        self.trainer._signal_connector.received_sigterm = True
        raise SIGTERMException()

    def stop_now(self, signum: int) -> None:
        """Another rank stopped the run on ``signum`` (a parameter server's reply said so): stop here."""
        self.agreed = self.agreed or int(signum)
        self._stop()

    def evaluation_starts(self, batches: Any) -> None:
        """At the start of a validation or test loop, on every rank: whether its ranks can agree per
        batch (every rank runs the same number of batches; one all-gather)."""
        if not _distributed(self.trainer):
            self._evaluation_agrees = False
            return
        count = sum(b if isinstance(b, int) else -1 for b in batches) if isinstance(batches, list) else -1
        counts = all_gather(torch.tensor([count], dtype=torch.int64))
        self._evaluation_agrees = count >= 0 and all(int(c.item()) == count for c in counts)
        self._evaluation_batch = 0
        if self._evaluation_agrees and self._evaluation_world is not dist.group.WORLD:  # every rank: its group is made
            self._evaluation_agreement, self._evaluation_world = Deferred(lag=1), dist.group.WORLD

    def agree_in_evaluation(self) -> None:
        """Before a validation or test batch: stop every rank here if any asked (where
        :meth:`evaluation_starts` found equal loops: every :data:`EVALUATION_STRIDE` batches a MAX all-reduce
        is started and the one before read, :class:`Deferred`, so that no batch waits a network round trip
        for it; else each rank on its own request, and only in a one-process run)."""
        trainer = self.trainer
        if self._evaluation_agrees and self._evaluation_agreement is not None:
            if self._evaluation_batch % EVALUATION_STRIDE == 0:
                self.agreed = self.agreed or self._evaluation_agreement(self.requested)
            self._evaluation_batch += 1
        elif not _distributed(trainer):
            self.agreed = self.agreed or self.requested
        if self.agreed:
            self._stop()

    def evaluation_ends(self) -> None:
        """At the end of a validation or test loop (every rank): one agreement waited for, so that a stop asked
        for during the loop stops every rank at its end (its periodic agreements may not have been read)."""
        if self._evaluation_agrees and _distributed(self.trainer):
            self.agreed = self.agreed or EveryBatch()(self.requested)
            if self.agreed:
                self._stop()

    @property
    def agreed_signal(self) -> str | None:
        """The name of the signal the ranks stopped on, or of the one asked for here."""
        signum = self.agreed or self.requested
        return signal.Signals(signum).name if signum else None


_MEETINGS: weakref.WeakKeyDictionary[pl.Trainer, BatchMeeting] = weakref.WeakKeyDictionary()


def meeting(trainer: pl.Trainer) -> BatchMeeting:
    """The Trainer's meeting point (made on first use; see :meth:`BatchMeeting.attach`)."""
    found = _MEETINGS.get(trainer)
    if found is None:
        found = _MEETINGS[trainer] = BatchMeeting(trainer)
    return found


def stop_if_agreed(strategy: Any, carried: Any) -> None:
    """At a sync point of ranks that agree on a stop through their exchanges (:class:`~lightning_hybrid.strategies.
    meeting.Carried`): stop here if an exchange already carried the agreement. The others stop before their next
    batch; a rank whose data ended at that step has no next batch, and would wait at the sync point for ranks that
    are gone."""
    if carried is not None and carried.agreed:
        meeting(strategy.lightning_module.trainer).stop_now(carried.agreed)
