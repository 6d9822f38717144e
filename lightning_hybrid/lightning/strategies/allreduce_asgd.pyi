# Generated from lightning_hybrid/strategies/allreduce_asgd.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import time
from collections.abc import Callable
from typing import Any
import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from lightning_hybrid.comm.delayed_allreduce import DelayedAllReduce, learning_rates, step_at, validate
from lightning_hybrid.comm.delayed_averaging import DelayedGradientAveraging
from lightning_hybrid.parameter_server.update_rule import MOMENTUM_CORRECTIONS, UpdateRule
from lightning_hybrid.lightning.strategies import common
from lightning_hybrid.strategies.clip_record import ClipRecord
from lightning_hybrid.lightning.strategies.even_batches import EvenBatches, even_batches
from lightning_hybrid.lightning.strategies.meeting import Agreement, Carried, EveryBatch
from lightning_hybrid.strategies.rank_states import RankStates
PENDING_KEY = ...
METHODS = ...

def check_settings(method: str, delay: int, compensation: str | None, dc_lambda: float, bucket_size_mb: float, warmup_steps: int, momentum_correction: str | None) -> str | None:
    ...

class AllReduceASGDStrategy(RankStates, common.UnwrappedDDPStrategy):
    strategy_name = ...
    aliases = ...
    rank_states_key = ...

    def __init__(self, delay: int=1, method: str='dga', compensation: str | None=None, dc_lambda: float=0.04, bucket_size_mb: float=25.0, warmup_steps: int=0, momentum_correction: str | None='auto', **kwargs: Any) -> None:
        ...

    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        ...

    def ranks_differ(self) -> bool:
        ...

    def own_state(self) -> Any:
        ...

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any=None) -> None:
        ...

    def _settled(self, checkpoint: dict[str, Any]) -> dict[str, Any]:
        ...

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None=None) -> dict[str, Any]:
        ...

    def load_model_state_dict(self, checkpoint: Any, strict: bool=True) -> None:
        ...

    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        ...

    def on_epoch_start(self, trainer: pl.Trainer) -> None:
        ...

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        ...

    def on_sync_start(self, trainer: pl.Trainer) -> None:
        ...

    def setup(self, trainer: pl.Trainer) -> None:
        ...

    def _correct_momentum(self, optimizer: torch.optim.Optimizer) -> None:
        ...

    def stop_agreement(self, trainer: pl.Trainer) -> Agreement:
        ...

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any=None, **kwargs: Any) -> Any:
        ...

    @property
    def _exchange(self) -> DelayedAllReduce:
        ...

    @property
    def _synchronous(self) -> bool:
        ...

    def _start_exchange(self, optimizer: torch.optim.Optimizer) -> None:
        ...

    def _step(self, optimizer: torch.optim.Optimizer) -> None:
        ...

    def sync_point(self) -> None:
        ...

    def on_sync_end(self) -> None:
        ...

    def teardown(self) -> None:
        ...
