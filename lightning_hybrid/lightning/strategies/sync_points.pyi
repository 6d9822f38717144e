# Generated from lightning_hybrid/strategies/sync_points.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
from typing import Any
import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

class SyncPoints(Callback):

    def __init__(self, strategy: Any) -> None:
        ...

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ...

    def _sync_before_validation(self, trainer: pl.Trainer) -> None:
        ...

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ...

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ...

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ...
