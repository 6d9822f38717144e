# Generated from lightning_hybrid/strategies/fsdp2.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
from collections.abc import Mapping
from typing import Any
import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning_hybrid.comm import fsdp
from lightning_hybrid.pipeline.module_contract import found_sequential
from lightning_hybrid.lightning.strategies import common
from lightning_hybrid.lightning.strategies.even_batches import refuse_uneven_loaders
from lightning_hybrid.lightning.strategies.meeting import meeting

class FullyShardedStrategy(common.UnwrappedDDPStrategy):
    strategy_name = ...
    aliases = ...

    def __init__(self, reshard_after_forward: bool=True, **kwargs: Any) -> None:
        ...

    @property
    def memory_layout(self) -> dict:
        ...

    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        ...

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        ...

    def setup(self, trainer: pl.Trainer) -> None:
        ...

    def on_epoch_start(self, trainer: pl.Trainer) -> None:
        ...

    def lightning_module_state_dict(self) -> dict[str, Any]:
        ...

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        ...

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool=True) -> None:
        ...

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        ...

def _sharded(module: torch.nn.Module) -> bool:
    ...
