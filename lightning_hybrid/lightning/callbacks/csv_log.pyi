# Generated from lightning_hybrid/callbacks/csv_log.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import csv
import os
import lightning.pytorch as pl

class ContinueCSVLog(pl.Callback):

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        ...
