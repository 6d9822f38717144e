# Generated from lightning_hybrid/strategies/common.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import os
import time
from collections.abc import Callable
from typing import Any, ClassVar
import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from lightning.fabric.utilities.distributed import _set_num_threads_if_needed
from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from lightning_hybrid.comm.collectives import broadcast_module_, ddp_group, workers_backend
from lightning_hybrid.strategies.capabilities import Capabilities
from lightning_hybrid.lightning.strategies.checkpoint_io import AtomicCheckpointIO
from lightning_hybrid.strategies.forked_ranks import fork_ranks
from lightning_hybrid.lightning.strategies.meeting import Agreement, Deferred, EveryBatch, meeting
from lightning_hybrid.strategies.process_watch import CHILD_GRACE_S, LAUNCHER_PID_ENV, ProcessWatch, die_with_parent
from lightning_hybrid.lightning.strategies.sync_points import SyncPoints

class CheckingLauncher(_SubprocessScriptLauncher):

    def __init__(self, strategy: Any, *args: Any) -> None:
        ...

    def launch(self, function: Callable, *args: Any, trainer: pl.Trainer | None=None, **kwargs: Any) -> Any:
        ...

    def _fork_children(self) -> int:
        ...

def refuse_unindexed_training_data(name: str, loader: object, why: str) -> None:
    ...

def refuse_manual_optimization(name: str, model: pl.LightningModule | None, why: str) -> None:
    ...

def refuse_mid_epoch_checkpoints(name: str, trainer: pl.Trainer, instead: str='Use every_n_epochs.') -> None:
    ...

def single_optimizer(name: str, optimizers: list[torch.optim.Optimizer]) -> torch.optim.Optimizer:
    ...

def refuse_grad_scaler(name: str, precision_plugin: Any) -> None:
    ...

class ReplacedStep:

    def __init__(self, optimizer: torch.optim.Optimizer, step_fn: Callable[[torch.optim.Optimizer], None]) -> None:
        ...

    def __getattr__(self, name: str) -> Any:
        ...

    def step(self, closure: Callable[[], Any] | None=None) -> Any:
        ...

def stop_if_agreed(strategy: Any, carried: Any) -> None:
    ...

def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    ...
CHAINED_HOOKS = ...

def one_bucket_mb(model: torch.nn.Module) -> float:
    ...

class CheckedDDPStrategy(Capabilities, DDPStrategy):
    aliases: ClassVar[dict[str, tuple[str, dict[str, Any]]]] = ...
    process_role: ClassVar[str] = ...

    @property
    def forks_ranks(self) -> bool:
        ...

    def __init__(self, *, accelerator: Any=None, parallel_devices: list[torch.device] | None=None, cluster_environment: Any=None, checkpoint_io: Any=None, precision_plugin: Any=None, process_group_backend: str | None=None, processes_per_device: int=1, fork_ranks: bool=False, ddp_kwargs: dict[str, Any] | None=None) -> None:
        ...

    @property
    def parallel_devices(self) -> list[torch.device] | None:
        ...

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device] | None) -> None:
        ...

    def _get_process_group_backend(self) -> str:
        ...

    def setup_distributed(self) -> None:
        ...

    def setup(self, trainer: pl.Trainer) -> None:
        ...

    def stop_agreement(self, trainer: pl.Trainer) -> Agreement:
        ...

    def requested_stop(self) -> int:
        ...

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        ...

    def _register_ddp_hooks(self) -> None:
        ...

    def check_devices(self) -> None:
        ...

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        ...

    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        ...

    def check_training_data(self, loader: object) -> None:
        ...

    def _configure_launcher(self) -> None:
        ...

    @property
    def worker_loss_is_fatal(self) -> bool:
        ...

    def on_ranks_forked(self) -> None:
        ...

    @property
    def process_watch(self) -> ProcessWatch | None:
        ...

    @staticmethod
    def _started_by_our_launcher() -> bool:
        ...

    def setup_environment(self) -> None:
        ...

    def on_exception(self, exception: BaseException) -> None:
        ...

    def attach_callback(self, trainer: pl.Trainer, callback: Callback) -> None:
        ...

    def teardown(self) -> None:
        ...

class UnwrappedDDPStrategy(CheckedDDPStrategy):
    exchange_group: Any = ...

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        ...

    def keeps_own_model(self) -> bool:
        ...

    def setup_exchange(self, trainer: pl.Trainer) -> tuple[torch.optim.Optimizer, list[torch.Tensor]]:
        ...

    def _register_ddp_hooks(self) -> None:
        ...

    def attach_sync_points(self, trainer: pl.Trainer) -> None:
        ...

    def on_sync_start(self, trainer: pl.Trainer) -> None:
        ...

    def on_epoch_start(self, trainer: pl.Trainer) -> None:
        ...

    def sync_point(self) -> None:
        ...

    def sync_before_validation(self) -> None:
        ...

    def after_epoch_sync(self, pl_module: pl.LightningModule) -> None:
        ...

    def on_sync_end(self) -> None:
        ...
