# Generated from lightning_hybrid/preemption.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""Preemption: a fit stopped by a signal saves a checkpoint, requeues a SLURM job, and a rerun continues.

    trainer = pl.Trainer(strategy="ssp_delay", devices=2, callbacks=[Preemption()])   # the CLI adds it

:class:`Preemption` (a Lightning callback) makes SIGTERM (a scheduler's stop), SIGINT (Ctrl+C, once;
twice interrupts at once) and SLURM's requeue signal (``requeue_signal``, SIGUSR2: what
``hydra/launcher=slurm`` asks for with ``--signal``) stop the fit between two batches, wherever the signal arrives: the handler only records
it, and the ranks agree before each training, validation or test batch whether any of them was
asked to stop (:mod:`lightning_hybrid.lightning.strategies.meeting`), so every rank stops at the same batch
(the parameter-server workers, which do not meet between sync points, each at its next batch).
The handlers are in place from the fit's setup (the CLI's, :meth:`Preemption.arm`, from before
the fit) until its end; a stop asked for during set-up or the sanity check takes effect at the
first batch, before any training: nothing is saved, and a rerun starts over. Then:

* where the strategy can continue an epoch (:func:`resumes_mid_epoch`: DDP, the balanced and
  delayed all-reduce strategies, the pipeline with per-step gradient sync), it saves
  ``last-interrupted.ckpt`` with the full state at that batch: parameters, optimizer, loops (how many
  batches of the epoch are done), the strategy's own state (shares, pending delayed averages,
  every pipeline stage). A run resumed from it skips those batches of the epoch without training
  on them (:func:`skip_done_batches`: their indices are drawn, as the sampler's epoch permutation
  gives them, and the batches are loaded but not used), so each remaining sample is trained once;
* the parameter-server strategies (SSP, cNeural) keep no such state between their sync points
  (workers at different clocks, chunks handed out by the dispenser, a full-batch pass's partial
  sums), so the callback saves ``last-epoch-end.ckpt`` at each epoch's end (after the strategy's sync)
  and a stop resumes from it, repeating the epoch: the final line says so;
* with the requeue signal inside a SLURM job, rank 0 runs ``scontrol requeue <job id>`` once the
  checkpoint is written; the requeued job reruns the same command in the same folder, which
  resumes from it (``ckpt_path=auto``).

:attr:`Preemption.stop` records what happened, for the CLI's final line and exit status (128 + the
signal's number, as a shell reports a process a signal ended).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import threading
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.utilities.data import _set_sampler_epoch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_hybrid.fit_stop import CHECKPOINT_NAME, EPOCH_END_NAME, Stop
from lightning_hybrid.lightning.strategies.checked_ddp import CheckedDDPStrategy
from lightning_hybrid.strategies.capabilities import capabilities_of
from lightning_hybrid.strategies.agreements import Deferred
from lightning_hybrid.lightning.strategies.meeting import meeting

log = logging.getLogger(__name__)



def resumes_mid_epoch(strategy: Any) -> bool:
    """Whether a checkpoint saved between two batches holds all of ``strategy``'s state (the
    strategy's ``resumes_mid_epoch`` attribute; Lightning's own strategies: yes)."""
    return bool(capabilities_of(strategy).resumes_mid_epoch)


def slurm_job_id(environ: Any = os.environ) -> str | None:
    """The id ``scontrol requeue`` takes for this SLURM job (``<array job>_<task>`` in an array)."""
    if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    return environ.get("SLURM_JOB_ID") or None


def requeue_slurm_job(job_id: str) -> bool:
    """``scontrol requeue <job_id>``; whether it succeeded (a failure is logged, not raised)."""
    if not re.fullmatch(r"[0-9_]+", job_id):
        log.warning("not requeueing SLURM job %r: not a job id", job_id)
        return False
    try:
        result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        log.warning("scontrol requeue %s failed: %s", job_id, error)
        return False
    if result.returncode != 0:
        log.warning("scontrol requeue %s exited %d: %s", job_id, result.returncode, result.stderr.strip())
    return result.returncode == 0


def skip_done_batches(trainer: pl.Trainer) -> int:
    """In a fit resumed from a mid-epoch checkpoint: draw the batches of the epoch that were done
    before it, from a fresh iterator over the epoch's permutation, so that training continues with
    the next one. Returns how many were skipped."""
    loop = trainer.fit_loop
    done = loop.epoch_loop.batch_progress.current.completed
    if not loop.restarted_mid_epoch or done <= 0 or loop._combined_loader is None or loop._data_fetcher is None:
        return 0
    for loader in loop._combined_loader.flattened:
        _set_sampler_epoch(loader, loop.epoch_progress.current.processed)
    iter(loop._data_fetcher)  # a new iterator: the sampler's permutation for this epoch
    iterator = loop._data_fetcher.iterator
    for _ in range(done):
        next(iterator)
    capabilities_of(trainer.strategy).on_batches_skipped(done)
    return done


class Preemption(pl.Callback):
    """Stop a fit cleanly on SIGTERM, SIGINT or SLURM's requeue signal, save a checkpoint to resume
    from, requeue the SLURM job (see the module docstring).

    Args:
        dirpath: the folder of ``last-interrupted.ckpt``; None: the ``ModelCheckpoint`` callback's folder,
            else ``<default_root_dir>/checkpoints``.
        requeue_signal: the signal SLURM sends before the time limit (``sbatch --signal``), or None.
        requeue: run ``scontrol requeue`` on the requeue signal inside a SLURM job.
    """

    def __init__(self, dirpath: str | Path | None = None, requeue_signal: str | None = "SIGUSR2",
                 requeue: bool = True) -> None:
        self.dirpath = None if dirpath is None else Path(dirpath)
        self.requeue_signal = None if requeue_signal is None else signal.Signals[requeue_signal]
        self.requeue = requeue
        #: What stopped the fit (None while it runs).
        self.stop: Stop | None = None
        #: The first stop signal this process received (its name), None before one.
        self.received: str | None = None
        self._saved_handlers: dict[int, Any] = {}
        #: After a stop, in the process that started the other ranks: their processes (they end on their own).
        self.ranks_started: list[Any] = []
        self._armed_by_caller = False
        self._trainer: pl.Trainer | None = None

    # ------------------------------------------------------------------ signals
    def arm(self) -> None:
        """Install the handlers now and keep them until :meth:`disarm` (the CLI, around the whole job:
        a signal during set-up, or a second one while the stop's checkpoint is written, is one orderly
        stop). Without it, :meth:`setup` installs them for the fit or test and removes them after."""
        if self._install():
            self._armed_by_caller = True

    def disarm(self) -> None:
        self._armed_by_caller = False
        self._restore_handlers()

    def _install(self) -> bool:
        """SIGTERM, SIGINT and the requeue signal stop the fit (in the main thread only, as signal
        handlers must be). The handler records the signal and asks this Trainer's meeting point to stop
        (:mod:`lightning_hybrid.lightning.strategies.meeting`), nothing more: no logging (a handler that runs
        while this process is inside a logging call would write into the same stream and fail
        re-entrantly), no collective (a rank inside one would start a second). A second SIGINT
        interrupts at once, as Ctrl+C twice does."""
        if self._saved_handlers or threading.current_thread() is not threading.main_thread():
            return False

        def on_stop_signal(signum: int, frame: Any) -> None:
            if signum == signal.SIGINT and self.received is not None:
                raise KeyboardInterrupt  # a second Ctrl+C: now
            self.received = self.received or signal.Signals(signum).name
            if self._trainer is not None:
                meeting(self._trainer).request_stop(signum)

        signals = [signal.SIGTERM, signal.SIGINT] + ([self.requeue_signal] if self.requeue_signal is not None else [])
        for signum in signals:
            self._saved_handlers[signum] = signal.getsignal(signum)
            signal.signal(signum, on_stop_signal)
        return True

    def _restore_handlers(self) -> None:
        for signum, handler in self._saved_handlers.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._saved_handlers = {}

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer
        self._install()
        agreement = meeting(trainer).attach()
        if stage == "fit" and not isinstance(trainer.strategy, CheckedDDPStrategy) and trainer.world_size > 1:
            # Lightning's own strategies (ddp): the stop agreed a step late, as our synchronous ones agree it,
            # never a collective waited for before each batch (ours choose at their setup, after this).
            agreement.agree_by(Deferred(lag=max(int(trainer.accumulate_grad_batches or 1), 1)))
        if self.received is not None:  # asked for before the meeting existed (set-up)
            agreement.request_stop(signal.Signals[self.received])

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        skipped = skip_done_batches(trainer)
        if skipped:
            # Lightning warns that a loader without state_dict() restarts the epoch from its start: not here.
            warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch")
            log.info("rank %d: resumed in epoch %d; its first %d batches were trained before the checkpoint",
                     trainer.global_rank, trainer.current_epoch + 1, skipped)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        if trainer.world_size == 1 and meeting(trainer).requested:
            trainer._signal_connector.received_sigterm = True  # one process: Lightning stops after this batch

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        meeting(trainer).evaluation_starts(trainer.num_sanity_val_batches if trainer.sanity_checking
                                           else trainer.num_val_batches)

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        meeting(trainer).evaluation_starts(trainer.num_test_batches)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        meeting(trainer).evaluation_ends()

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        meeting(trainer).evaluation_ends()

    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        meeting(trainer).agree_in_evaluation()

    def on_test_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                            batch_idx: int, dataloader_idx: int = 0) -> None:
        meeting(trainer).agree_in_evaluation()

    # ------------------------------------------------------------------ the stop
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        stopped_by = meeting(trainer).agreed_signal or self.received or "SIGTERM"
        self._end(trainer)
        if not isinstance(exception, SIGTERMException):
            return
        started = getattr(trainer.strategy.launcher, "procs", None)
        if started:  # they end on their own now: Lightning's observer would kill every process at their exit status
            self.ranks_started, started[:] = list(started), []
        self.received = self.received or stopped_by
        if trainer.state.fn != "fit":
            self.stop = Stop(signal=stopped_by, strategy=type(trainer.strategy).__name__)
            return
        loop = trainer.fit_loop
        strategy = trainer.strategy
        stop = Stop(signal=stopped_by, epoch=trainer.current_epoch,
                    batches_done=loop.epoch_loop.batch_progress.current.completed,
                    batches=trainer.num_training_batches, strategy=type(strategy).__name__)
        stop.before_training = (trainer.global_step == 0 and stop.epoch == 0 and stop.batches_done == 0
                                and loop.epoch_loop.batch_progress.total.completed == 0)
        if stop.before_training:
            pass  # nothing trained: nothing to save
        elif resumes_mid_epoch(strategy):
            path = self._checkpoint_dir(trainer) / CHECKPOINT_NAME
            trainer.save_checkpoint(path, weights_only=False)
            stop.checkpoint, stop.mid_epoch = path, True
        else:
            path = self._checkpoint_dir(trainer) / EPOCH_END_NAME
            stop.checkpoint = path if path.is_file() else None
        if (self.requeue and self.requeue_signal is not None and stop.signal == self.requeue_signal.name
                and trainer.is_global_zero and (job := slurm_job_id()) is not None and requeue_slurm_job(job)):
            stop.requeued = job
        self.stop = stop

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Under a strategy that cannot resume mid-epoch: the state to resume from after a stop in the
        next epoch (the strategy's sync has run: its callback comes first)."""
        if not resumes_mid_epoch(trainer.strategy):
            trainer.save_checkpoint(self._checkpoint_dir(trainer) / EPOCH_END_NAME, weights_only=False)

    def _checkpoint_dir(self, trainer: pl.Trainer) -> Path:
        if self.dirpath is not None:
            return self.dirpath
        callback = trainer.checkpoint_callback
        if callback is not None and getattr(callback, "dirpath", None):
            return Path(callback.dirpath)
        return Path(trainer.default_root_dir) / "checkpoints"

    def _end(self, trainer: pl.Trainer) -> None:
        """The fit or test is over: Lightning's per-batch hook back, and the handlers unless the caller
        armed them."""
        meeting(trainer).detach()
        if not self._armed_by_caller:
            self._restore_handlers()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._end(trainer)
