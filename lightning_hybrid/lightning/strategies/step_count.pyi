# Generated from lightning_hybrid/strategies/step_count.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
from typing import Any
import lightning.pytorch as pl
from lightning.pytorch.trainer import call

class ServerSteps:

    def __init__(self, trainer: pl.Trainer, base: int=0) -> None:
        ...

    def server_at(self, version: int) -> None:
        ...

    def after_batch(self) -> None:
        ...

    def synchronized(self) -> None:
        ...

    def remove(self) -> None:
        ...

def restored_global_step(trainer: pl.Trainer) -> int:
    ...
