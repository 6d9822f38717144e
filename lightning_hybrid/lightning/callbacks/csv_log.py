# Generated from lightning_hybrid/callbacks/csv_log.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""CSV logs continued across spawned stages."""

from __future__ import annotations

import csv
import os

import lightning.pytorch as pl


class ContinueCSVLog(pl.Callback):
    """Lightning's ``CSVLogger`` re-created in a new process over the ``metrics.csv`` an earlier stage
    wrote (``strategy=ddp_spawn`` spawns its ranks afresh for ``trainer.test`` after ``fit``) does not know
    that file's columns, and its first rewrite of the header fails ("dict contains fields not in
    fieldnames"): at each stage's setup, rank 0's writer gets them back. The CLI adds it."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            if type(logger).__name__ != "CSVLogger":
                continue
            writer = logger.experiment
            path = getattr(writer, "metrics_file_path", None)
            if path and not writer.metrics_keys and os.path.isfile(path):
                with open(path, newline="") as f:
                    writer.metrics_keys = sorted(next(csv.reader(f), []))
