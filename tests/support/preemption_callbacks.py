"""Callbacks the preemption tests add to `lightning-hybrid` runs (``+callbacks.NAME._target_=preemption_callbacks.X``)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytorch_lightning as pl
import torch


class SignalAt(pl.Callback):
    """After training batch ``batch`` of epoch ``epoch``, rank ``rank`` (or every rank: a SLURM signal reaches
    every task) sends ``signame`` to its own process, as a scheduler would (or to its whole process
    group, as Ctrl+C in a terminal does); once per folder (the marker file records when), so that the
    rerun of the same command trains on."""

    def __init__(self, epoch: int, batch: int, marker: str, signame: str = "SIGTERM", every_rank: bool = False,
                 process_group: bool = False, rank: int = 0) -> None:
        self.epoch, self.batch, self.marker, self.rank = epoch, batch, Path(marker), rank
        self.signame, self.every_rank, self.process_group = signame, every_rank, process_group
        self.armed = not self.marker.exists()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.armed and trainer.current_epoch == self.epoch and batch_idx == self.batch and (
                trainer.global_rank == self.rank or self.every_rank):
            if trainer.global_rank == self.rank:
                self.marker.write_text(repr(time.time()))
            if self.process_group:  # Ctrl+C in a terminal: every process of the foreground group
                os.killpg(os.getpgrp(), signal.Signals[self.signame])
            else:
                os.kill(os.getpid(), signal.Signals[self.signame])


class FinalParameters(pl.Callback):
    """Rank 0 saves the module's parameters when the fit ends (every rank takes part: the pipeline's
    stages gather the whole model on rank 0)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_fit_end(self, trainer, pl_module):
        state = trainer.strategy.lightning_module_state_dict()
        if trainer.is_global_zero:
            torch.save({k: v.detach().cpu().clone() for k, v in state.items()}, self.path)


class Pids(pl.Callback):
    """Every rank writes its pid, and rank 0 the parameter servers', into ``folder`` (pid_*)."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_fit_start(self, trainer, pl_module):
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"pid_rank{trainer.global_rank}_{os.getpid()}").write_text(str(os.getpid()))
        for server in getattr(trainer.strategy, "_servers", []):
            (self.folder / f"pid_server_{server.pid}").write_text(str(server.pid))


class SampleFingerprints(pl.Callback):
    """Appends, per trained batch, ``epoch`` and each sample's fingerprint (the sum of its pixels) to
    ``folder/samples_rank{r}.txt``: which samples each epoch trained, across an interruption."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        x = batch[0]
        sums = x.reshape(len(x), -1).double().sum(1).tolist()
        with open(self.folder / f"samples_rank{trainer.global_rank}.txt", "a") as f:
            f.write(f"{trainer.current_epoch} {' '.join(f'{s:.6f}' for s in sums)}\n")


class ExtraCollectiveOnRankZero(pl.Callback):
    """At the end of training epoch ``epoch``, rank 0 alone issues an all-reduce (a desynchronisation
    on purpose: a callback that runs a collective under ``is_global_zero``)."""

    def __init__(self, epoch: int = 0) -> None:
        self.epoch = epoch

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch and trainer.is_global_zero:
            torch.distributed.all_reduce(torch.ones(1))


#: The fault matrix's cases, in the order a chain of reruns of one command meets them.
CASES = ("setup", "sanity", "validation", "checkpoint", "rank1", "twice", "test")


class FaultAt(pl.Callback):
    """A stop signal at the first of ``cases`` not yet done in ``folder`` (the firing rank writes a marker
    file, ``<folder>/<case>``, holding the time), so that each rerun of the same command meets the next:

    * ``setup``: rank 0, SIGTERM in the callbacks' setup (before the model is set up);
    * ``sanity``: rank 0, SIGTERM before the sanity check's first batch;
    * ``validation``: rank 0, SIGTERM before epoch 0's first validation batch;
    * ``checkpoint``: rank 0, SIGTERM while epoch 1's first checkpoint is being written;
    * ``rank1``: rank 1 alone, SIGTERM after epoch 2's batch 1 (or the first batch after it that the run trains);
    * ``twice``: rank 0, the requeue signal (SIGUSR2) twice in a row, after epoch 3's batch 1 (or the first after);
    * ``test``: rank 0, SIGTERM before the first test batch.
    """

    def __init__(self, folder: str, cases: str = ",".join(CASES)) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.case = next((c for c in cases.split(",") if not (self.folder / c).exists()), None)

    def _fire(self, trainer, case: str, rank: int = 0, signame: str = "SIGTERM", times: int = 1) -> None:
        if self.case != case or trainer.global_rank != rank:
            return
        self.case = None
        (self.folder / case).write_text(repr(time.time()))
        for _ in range(times):
            os.kill(os.getpid(), signal.Signals[signame])

    def setup(self, trainer, pl_module, stage):
        if stage == "fit":
            self._fire(trainer, "setup")

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 0 and trainer.sanity_checking:
            self._fire(trainer, "sanity")
        elif batch_idx == 0 and trainer.current_epoch == 0 and trainer.state.fn == "fit":
            self._fire(trainer, "validation")

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if trainer.current_epoch == 1:
            self._fire(trainer, "checkpoint")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # At the batch, or at the first one a resumed run trains after it: a stop under the delayed all-reduce or
        # local SGD rides on an exchange and lands up to its delay later, so the run before may have ended past it.
        at = (trainer.current_epoch, batch_idx)
        if (2, 1) <= at < (3, 0):
            self._fire(trainer, "rank1", rank=1)
        elif (3, 1) <= at:
            self._fire(trainer, "twice", signame="SIGUSR2", times=2)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 0:
            self._fire(trainer, "test")
