# Generated from lightning_hybrid/callbacks/progress.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""Progress lines: one line per interval of a run's progress where the output is not a terminal."""

from __future__ import annotations

import logging
import time
from typing import Any

import lightning.pytorch as pl

from lightning_hybrid.say import say

#: One log for the suite's callbacks (their lines read "lightning_hybrid.lightning.callbacks").
log = logging.getLogger("lightning_hybrid.lightning.callbacks")


class ProgressLog(pl.Callback):
    """Training progress as occasional log lines, for output that is not a terminal (a log file, a
    CI job, a batch scheduler), where a progress bar writes thousands of refreshes.

    On global rank 0, a line at most every ``every_s`` seconds during an epoch, and one at its end::

        epoch 2/10  batch 120/469 (26%)  310 samples/s  train/loss 0.1234

    The CLI uses it in place of the progress bar when its standard error is not a terminal
    (``progress=auto``; ``progress=bar`` or ``progress=log`` to choose).

    Args:
        every_s: seconds between lines within an epoch.
    """

    def __init__(self, every_s: float = 30.0) -> None:
        self.every_s = every_s
        self._last = 0.0
        self._epoch_start = 0.0
        self._samples = 0

    def _line(self, trainer: pl.Trainer, batch_idx: int | None) -> str:
        epochs = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        parts = [f"epoch {trainer.current_epoch + 1}{epochs}"]
        total = trainer.num_training_batches
        if batch_idx is not None:
            known = isinstance(total, int) and total > 0
            parts.append(f"batch {batch_idx + 1}" + (f"/{total} ({100 * (batch_idx + 1) / total:.0f}%)" if known else ""))
        else:
            parts.append("done")
        elapsed = time.perf_counter() - self._epoch_start
        if elapsed > 0 and self._samples:
            parts.append(f"{self._samples / elapsed:.0f} samples/s")
        for name, value in sorted(trainer.progress_bar_metrics.items()):
            parts.append(f"{name} {value:.4g}")
        return "  ".join(parts)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_start = self._last = time.perf_counter()
        self._samples = 0

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        first = batch[0] if isinstance(batch, (list, tuple)) else batch
        self._samples += len(first) if hasattr(first, "__len__") else 0
        now = time.perf_counter()
        if trainer.is_global_zero and now - self._last >= self.every_s:
            self._last = now
            say(log, self._line(trainer, batch_idx))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Every rank reads the metrics, rank 0 prints them: at an epoch's end a read computes the epoch's
        # values, and computing one synchronises it across the ranks (``sync_dist``, torchmetrics), so a
        # read on rank 0 alone issues collectives the others do not, and the ranks wait for each other
        # forever. Within an epoch a read returns the step values, already synchronised when logged.
        line = self._line(trainer, None)
        if trainer.is_global_zero:
            say(log, line)
