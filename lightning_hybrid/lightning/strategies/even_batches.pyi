# Generated from lightning_hybrid/strategies/even_batches.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import itertools
import math
from typing import Any
import lightning.pytorch as pl
import torch
from lightning_hybrid.comm.batch_counts import BatchCounts, UnevenBatchesError
from lightning_hybrid.comm.board import Board
from lightning_hybrid.comm.collectives import all_gather
FIX = ...
_FITS = ...

class EvenBatches:

    def __init__(self, name: str, rank: int, world_size: int, timeout_s: float) -> None:
        ...

    def check_lengths(self, trainer: pl.Trainer) -> None:
        ...

    def on_batch(self) -> None:
        ...

    def agree(self) -> None:
        ...

    def finish(self) -> None:
        ...

    def while_waiting(self) -> None:
        ...

def refuse_uneven_loaders(name: str, trainer: pl.Trainer) -> None:
    ...

def even_batches(strategy: Any) -> EvenBatches:
    ...
