# Generated from lightning_hybrid/callbacks/transfer_weights.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import logging
import lightning.pytorch as pl
from lightning_hybrid.transfer import load_transferred, read_state_dict, transfer_checkpoint
log = ...

class TransferWeights(pl.Callback):

    def __init__(self, path: str) -> None:
        ...

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ...
