"""Lightning's SIGTERM check between training batches, without its per-batch wait.

Lightning 2.6 broadcasts rank 0's "received SIGTERM" flag before every training batch and waits for
the broadcast (``_TrainingEpochLoop._broadcast_sigterm_tensor``), so that a preempted job stops on
every rank together. That broadcast is a synchronization point in every step: a fast rank waits
there for the slowest one, before its own compute, even where the strategy lets it go on (a
delayed all-reduce) or balances the work so that nobody waits (shares of the global batch). The
strategies replace it by one of:

* :class:`DeferredSigtermBroadcast` (ranks that meet at a per-step exchange: balanced data
  parallelism, the delayed all-reduce): each batch starts the broadcast in the background and reads
  the one started ``lag`` batches earlier, long done by then. Every rank still stops at the same
  batch, ``lag`` batches after rank 0's SIGTERM; nobody waits for it. The flags travel in a gloo
  group of their own (CPU tensors). Lightning's SIGTERM handler is replaced too: it broadcasts on
  the default group, for the other ranks' per-batch broadcast to receive (with that broadcast gone
  it would wait forever for a rank blocked in the step's all-reduce), and it sets the flag each rank
  checks after every batch on its own, so that ranks the signal reaches a batch apart stop a batch
  apart (the later one then fails on the closed connection). Here the handler only forwards the
  signal to the ranks the launcher started and records it; rank 0's record travels in the
  deferred broadcast and every rank stops at the same batch.
* :func:`check_sigterm_locally` (workers that never meet between sync points: the parameter server):
  each worker checks its own flag; the others stop when the server channel closes.

:class:`SigtermBroadcast` is Lightning's per-batch broadcast without its handler's own broadcast (for
:class:`lightning_hybrid.preemption.Preemption` under any other strategy): a rank that receives the
signal only sets its flag, and rank 0's flag, broadcast before each batch, stops every rank at the same
batch. Lightning's handler broadcasts from inside the handler, and rank 0 also stops on its own flag
after the batch: with the signal passed on to the other ranks, or a check after the batch on rank 0
only, the ranks end up in different collectives and wait for each other forever.
:func:`request_stop` sets the flag that the installed check reads.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.utilities.exceptions import SIGTERMException

from lightning_hybrid.comm.collectives import Pending, broadcast_, start_broadcast

_HOOK = "_broadcast_sigterm_tensor"
log = logging.getLogger(__name__)


class DeferredSigtermBroadcast:
    """Replaces Lightning's per-batch SIGTERM broadcast: each call starts this batch's broadcast and
    reads the one started ``lag`` calls before (see the module docstring)."""

    def __init__(self, trainer: pl.Trainer, lag: int = 1) -> None:
        if lag < 1:
            raise ValueError(f"lag must be at least one batch, got {lag}")
        self.trainer, self.lag = trainer, lag
        #: A SIGTERM was received here (rank 0's decides: it is what the broadcast carries).
        self.requested = False
        self._pending: deque[Pending] = deque()
        self.group = dist.new_group(backend="gloo")  # every rank creates it, in setup

    def __call__(self) -> None:
        if len(self._pending) >= self.lag and self._pending.popleft().wait().item() == 1:
            self._pending.clear()
            self.trainer._signal_connector.received_sigterm = True
            raise SIGTERMException()
        received = self.requested or bool(getattr(self.trainer, "received_sigterm", False))
        self._pending.append(start_broadcast(torch.tensor([int(received)]), src=0, group=self.group))


def defer_sigterm_broadcast(trainer: pl.Trainer, lag: int = 1) -> None:
    """Install a :class:`DeferredSigtermBroadcast` in this fit's training loop and a SIGTERM handler
    that does not broadcast (before Lightning registers its handlers; Lightning versions without the
    per-batch broadcast keep theirs)."""
    epoch_loop = trainer.fit_loop.epoch_loop
    if not hasattr(type(epoch_loop), _HOOK):
        return
    deferred = DeferredSigtermBroadcast(trainer, lag)
    setattr(epoch_loop, _HOOK, deferred)

    def notify(signum: int, frame: object) -> None:
        log.info("rank %d: received SIGTERM (%d); every rank stops %d batch(es) on", trainer.global_rank, signum, lag)
        if not deferred.requested and trainer.strategy.launcher is not None:
            trainer.strategy.launcher.kill(signum)  # as Lightning's handler: pass it on to the ranks started here
        deferred.requested = True

    trainer._signal_connector._sigterm_notifier_fn = notify


class SigtermBroadcast:
    """Before each training batch, rank 0's stop request to every rank (see the module docstring).
    With gradient accumulation the ranks stop at the next optimizer step's boundary, so that a
    checkpoint taken there holds no half-accumulated gradients (the rerun trains on from that step)."""

    def __init__(self, trainer: pl.Trainer) -> None:
        self.trainer = trainer
        #: A stop was requested here (rank 0's decides).
        self.requested = False
        #: Rank 0's request has arrived: stop at the next step boundary (every rank alike, no more broadcasts).
        self.stopping = False

    def __call__(self) -> None:
        if not self.stopping:
            self.stopping = broadcast_(torch.tensor([int(self.requested)]), src=0).item() == 1
        if self.stopping and self._at_step_boundary():
            self.trainer._signal_connector.received_sigterm = True
            raise SIGTERMException()

    def _at_step_boundary(self) -> bool:
        accumulate = max(int(self.trainer.accumulate_grad_batches or 1), 1)
        return self.trainer.fit_loop.epoch_loop.batch_progress.current.completed % accumulate == 0


def broadcast_sigterm(trainer: pl.Trainer) -> None:
    """Install a :class:`SigtermBroadcast` unless a strategy installed its own check (multi-process fits)."""
    epoch_loop = trainer.fit_loop.epoch_loop
    if hasattr(type(epoch_loop), _HOOK) and _HOOK not in vars(epoch_loop) and trainer.world_size > 1:
        setattr(epoch_loop, _HOOK, SigtermBroadcast(trainer))


def request_stop(trainer: pl.Trainer) -> None:
    """Ask this rank's fit to stop after the batch: through the installed per-batch check's flag (the
    broadcast ones: every rank stops where rank 0 does), or Lightning's flag that each rank checks on
    its own (one process, the parameter server's workers)."""
    check = vars(trainer.fit_loop.epoch_loop).get(_HOOK)
    check = getattr(check, "__wrapped__", check)  # a timing wrapper (lightning_hybrid.straggler)
    if isinstance(check, (SigtermBroadcast, DeferredSigtermBroadcast)):
        check.requested = True
    else:
        trainer._signal_connector.received_sigterm = True


def time_sigterm_check(trainer: pl.Trainer, record: Callable[[float], None]) -> None:
    """Wrap the per-batch stop check (Lightning's, a strategy's, or the preemption's) so that each
    call's seconds go to ``record``: ranks that meet there wait there for the slowest."""
    epoch_loop = trainer.fit_loop.epoch_loop
    if not hasattr(type(epoch_loop), _HOOK):
        return
    inner = vars(epoch_loop).get(_HOOK, getattr(epoch_loop, _HOOK))

    def timed() -> None:
        start = time.perf_counter()
        try:
            inner()
        finally:
            record(time.perf_counter() - start)

    timed.__wrapped__ = inner  # type: ignore[attr-defined]
    setattr(epoch_loop, _HOOK, timed)


def untime_sigterm_check(trainer: pl.Trainer) -> None:
    """Undo :func:`time_sigterm_check` (the check it wrapped is in force again)."""
    epoch_loop = trainer.fit_loop.epoch_loop
    check = vars(epoch_loop).get(_HOOK)
    inner = getattr(check, "__wrapped__", None)
    if inner is None:
        return
    if getattr(inner, "__self__", None) is epoch_loop:  # Lightning's own method
        vars(epoch_loop).pop(_HOOK)
    else:
        setattr(epoch_loop, _HOOK, inner)


def check_sigterm_locally(trainer: pl.Trainer) -> None:
    """Each rank checks its own SIGTERM flag between training batches, with no collective."""
    epoch_loop = trainer.fit_loop.epoch_loop
    if not hasattr(type(epoch_loop), _HOOK):
        return

    def check_local_sigterm() -> None:
        if getattr(trainer, "received_sigterm", False):
            raise SIGTERMException()

    setattr(epoch_loop, _HOOK, check_local_sigterm)


def restore_sigterm_broadcast(trainer: pl.Trainer) -> None:
    """Lightning's own per-batch broadcast and SIGTERM handler again (after the fit)."""
    vars(trainer.fit_loop.epoch_loop).pop(_HOOK, None)
    vars(trainer._signal_connector).pop("_sigterm_notifier_fn", None)
