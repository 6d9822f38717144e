# Generated from lightning_hybrid/callbacks/memory.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import lightning.pytorch as pl
import torch
from lightning_hybrid.devices import PeakMemory, held_bytes
from lightning_hybrid.strategies.capabilities import capabilities_of

class PeakMemoryMonitor(pl.Callback):

    def __init__(self) -> None:
        ...

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ...

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ...
