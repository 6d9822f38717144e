# Generated from lightning_hybrid/strategies/parameter_server.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import contextlib
import itertools
import logging
import signal
import subprocess
import time
from abc import abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar
import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import SIGTERMException
import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning_hybrid.comm.collectives import broadcast_
from lightning_hybrid.comm.flat import copy_into, flatten, gradients
from lightning_hybrid.comm.regroup import regroup_survivors
from lightning_hybrid.parameter_server import server_launch
from lightning_hybrid.parameter_server.channel import ChannelClosedError
from lightning_hybrid.parameter_server.client import ParameterServerClient, PullInfo, load_server_state
from lightning_hybrid.parameter_server.epoch_stats import WorkerEpochStats, epoch_history, epoch_logs, gather_stats, new_counts, summarise
from lightning_hybrid.parameter_server.hyperparameters import GroupLayout, GroupValues
from lightning_hybrid.parameter_server.load import ServerLoad
from lightning_hybrid.parameter_server.protocol import wire_dtype as wire_dtype_of
from lightning_hybrid.parameter_server.server_launch import SERVER_EXIT_S, TRANSPORTS
from lightning_hybrid.lightning.strategies import common
from lightning_hybrid.strategies.clip_record import ClipRecord
from lightning_hybrid.strategies.forked_ranks import ForkedProcess, Standby
from lightning_hybrid.lightning.strategies.meeting import Agreement, EveryBatch, ThroughServer, meeting
from lightning_hybrid.lightning.strategies.step_count import restored_global_step
log = ...
__all__ = ['SERVER_EXIT_S', 'TRANSPORTS', 'ParameterServerStrategy', 'WorkerEpochStats']
_SESSIONS = ...

class ParameterServerStrategy(common.UnwrappedDDPStrategy):
    min_workers: ClassVar[int] = ...
    metrics_prefix: ClassVar[str] = ...
    logged_stats: ClassVar[tuple[str, ...]] = ...
    batch_mode: ClassVar[bool] = ...
    validates_mid_epoch: ClassVar[bool] = ...
    mid_epoch_checkpoints_instead: ClassVar[str] = ...
    resumes_mid_epoch: ClassVar[bool] = ...

    def __init__(self, timeout: float=300.0, on_worker_failure: str='stop', transport: str='auto', wire_dtype: str='fp32', servers: int | str='auto', server_device: str='cpu', **kwargs: Any) -> None:
        ...

    @property
    def peer_timeout_s(self) -> float:
        ...

    @property
    def worker_loss_is_fatal(self) -> bool:
        ...

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        ...

    @property
    def num_workers(self) -> int:
        ...

    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        ...

    def check_val_check_interval(self, trainer: pl.Trainer) -> None:
        ...

    def setup(self, trainer: pl.Trainer) -> None:
        ...

    def stop_agreement(self, trainer: pl.Trainer) -> Agreement:
        ...

    def _stopped_by_a_peer(self, signum: int) -> None:
        ...

    def _open_server_channel(self) -> None:
        ...

    def on_ranks_forked(self) -> None:
        ...

    def _update_rule(self) -> dict[str, Any]:
        ...

    def _note(self, info: PullInfo) -> PullInfo:
        ...

    def _regroup_without_lost(self, info: PullInfo) -> None:
        ...

    def on_sync_start(self, trainer: pl.Trainer) -> None:
        ...

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any=None, **kwargs: Any) -> Any:
        ...

    @abstractmethod
    def _replaced_step(self, optimizer: torch.optim.Optimizer) -> None:
        ...

    def _hyperparameters(self, optimizer: torch.optim.Optimizer) -> GroupValues:
        ...

    def _flat_grad(self) -> torch.Tensor:
        ...

    def _load_flat(self) -> None:
        ...

    def _timed(self, request: Callable[[], Any]) -> Any:
        ...

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        ...

    def _count_samples(self, samples: int) -> None:
        ...

    def _reset_epoch_stats(self) -> None:
        ...

    def _begin_async_phase(self) -> None:
        ...

    def sync_point(self) -> None:
        ...

    def _before_sync(self) -> None:
        ...

    def _pull_at_sync(self) -> None:
        ...

    def after_epoch_sync(self, pl_module: pl.LightningModule) -> None:
        ...

    def on_sync_end(self) -> None:
        ...

    def on_exception(self, exception: BaseException) -> None:
        ...

    def _stop_server(self, ask_to_end: Callable[[], Any], patience_s: float=30.0) -> Any:
        ...

    def _workers_meet(self) -> bool:
        ...

    def reduce(self, tensor: Any, group: Any=None, reduce_op: Any='mean') -> Any:
        ...

    def barrier(self, name: str | None=None) -> None:
        ...

    def teardown(self) -> None:
        ...
