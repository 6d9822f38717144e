# Generated from lightning_hybrid/strategies/balanced.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import os
from collections.abc import Callable
from typing import Any
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities.data import _get_dataloader_init_args_and_kwargs, _reinstantiate_wrapped_cls
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch.utils.data import DistributedSampler, SequentialSampler
from lightning_hybrid.balance import BalancedBatchSampler, CycleClock, Dealt, Meter, ShareSchedule, SpeedEstimator, agreed_start, apportion, check_global_batch, check_speeds, timed_sum_hook, worth_changing
from lightning_hybrid.comm.collectives import all_gather
from lightning_hybrid.lightning.strategies import common
from lightning_hybrid.lightning.strategies.meeting import Agreement, Deferred, EveryBatch
__all__ = ['BalanceEpochs', 'BalancedDataParallelStrategy']
STATE_KEY = ...

def _whole(name: str, value: Any, least: int) -> int:
    ...

class BalanceEpochs(Callback):

    def __init__(self, strategy: BalancedDataParallelStrategy) -> None:
        ...

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ...

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ...

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ...

class BalancedDataParallelStrategy(common.CheckedDDPStrategy):
    strategy_name = ...
    aliases = ...

    def __init__(self, global_batch: int | None=None, speeds: list[float] | None=None, measure_steps: int=10, rebalance_every: int | None=100, min_share: int=1, smoothing: float=0.5, tolerance: float=0.05, find_unused_parameters: bool=False, **kwargs: Any) -> None:
        ...

    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        ...
    slows_its_compute = ...

    def inject_compute_slowdown(self, factor: float) -> None:
        ...

    def setup(self, trainer: pl.Trainer) -> None:
        ...

    def stop_agreement(self, trainer: pl.Trainer) -> Agreement:
        ...

    def _register_ddp_hooks(self) -> None:
        ...

    def check_training_data(self, loader: object) -> None:
        ...

    def process_dataloader(self, dataloader: object) -> object:
        ...

    def _first_schedule(self, global_batch: int, global_step: int) -> ShareSchedule:
        ...

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        ...

    def on_batches_skipped(self, batches: int) -> None:
        ...

    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        ...

    def post_backward(self, closure_loss: torch.Tensor) -> None:
        ...

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any=None, **kwargs: Any) -> Any:
        ...

    def _rebalance(self, done: int) -> None:
        ...

    def on_epoch_start(self, trainer: pl.Trainer) -> None:
        ...

    def interrupt_cycle(self) -> None:
        ...

    def on_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ...

    def balance_state(self) -> dict[str, Any]:
        ...

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any=None) -> None:
        ...

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None=None) -> dict[str, Any]:
        ...
