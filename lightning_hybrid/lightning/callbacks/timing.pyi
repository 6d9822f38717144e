# Generated from lightning_hybrid/callbacks/timing.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import time
import lightning.pytorch as pl

class EpochTimer(pl.Callback):

    def __init__(self) -> None:
        ...

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ...

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ...

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ...

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ...

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        ...

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx: int) -> None:
        ...

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ...
