# Generated from lightning_hybrid/callbacks/progress.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import logging
import time
from typing import Any
import lightning.pytorch as pl
from lightning_hybrid.say import say
log = ...

class ProgressLog(pl.Callback):

    def __init__(self, every_s: float=30.0) -> None:
        ...

    def _line(self, trainer: pl.Trainer, batch_idx: int | None) -> str:
        ...

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ...

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        ...

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ...
