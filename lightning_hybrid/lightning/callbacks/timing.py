# Generated from lightning_hybrid/callbacks/timing.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""Epoch timing: each training epoch's wall-clock seconds and samples per second, logged."""

from __future__ import annotations

import time

import lightning.pytorch as pl


class EpochTimer(pl.Callback):
    """Logs each training epoch's wall-clock time and throughput.

    Logged once per epoch, per rank (rank 0's values reach the loggers): ``time/epoch_s`` (seconds
    from the first training batch to the end of the training epoch, validation excluded),
    ``time/samples_per_s`` (training samples this rank processed per second in that time) and
    ``time/elapsed_s`` (wall-clock seconds since training started, up to the end of this epoch's
    validation: the time axis of time-to-accuracy comparisons) and ``time/training_s`` (the same
    clock without the time spent in validation loops: what training itself cost up to that point).

    Example::

        >>> timer = EpochTimer()
        >>> # pl.Trainer(callbacks=[timer]); afterwards timer.epoch_times holds one entry per epoch
    """

    def __init__(self) -> None:
        self.epoch_times: list[float] = []
        self._start: float | None = None
        self._fit_start: float | None = None
        self._end = 0.0
        self._samples = 0
        self._validating_since: float | None = None
        self._validation_s = 0.0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._fit_start = time.perf_counter()
        self._validation_s = 0.0

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._validating_since = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._validating_since is not None and self._fit_start is not None:
            self._validation_s += time.perf_counter() - self._validating_since
        self._validating_since = None

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start, self._samples = None, 0

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        if self._start is None:
            self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx: int) -> None:
        first = batch[0] if isinstance(batch, (list, tuple)) else batch
        self._samples += len(first)
        self._end = time.perf_counter()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._start is None:
            return
        # Up to the end of the last batch: validation runs before on_train_epoch_end.
        elapsed = self._end - self._start
        self.epoch_times.append(elapsed)
        pl_module.log("time/epoch_s", elapsed, on_step=False, on_epoch=True)
        pl_module.log("time/samples_per_s", self._samples / max(elapsed, 1e-9), on_step=False, on_epoch=True)
        if self._fit_start is not None:
            elapsed_since_start = time.perf_counter() - self._fit_start
            pl_module.log("time/elapsed_s", elapsed_since_start, on_step=False, on_epoch=True)
            pl_module.log("time/training_s", elapsed_since_start - self._validation_s, on_step=False, on_epoch=True)
