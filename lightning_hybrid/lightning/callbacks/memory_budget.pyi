# Generated from lightning_hybrid/callbacks/memory_budget.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
from collections.abc import Sequence
from typing import Any
import lightning.pytorch as pl
import torch
from lightning_hybrid.data.shapes import batch_size_of, sample_shape
from lightning_hybrid.devices import parse_size
from lightning_hybrid.pipeline.module_contract import pipeline_blocks
from lightning_hybrid.placement.memory import MiB, TrainingMemory, optimizer_slots, training_memory
from lightning_hybrid.strategies.capabilities import capabilities_of

class MemoryBudgetExceeded(ValueError):
    ...

class MemoryBudget(pl.Callback):

    def __init__(self, limit: float | str | Sequence[float | str]) -> None:
        ...

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        ...

    def check(self, strategy: Any, pl_module: pl.LightningModule, datamodule: Any) -> None:
        ...

    @staticmethod
    def estimate(pl_module: pl.LightningModule, datamodule: Any, **layout: Any) -> TrainingMemory | None:
        ...

def _first_optimizer(configured: Any) -> torch.optim.Optimizer | None:
    ...
