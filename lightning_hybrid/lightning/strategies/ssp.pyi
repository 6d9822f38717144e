# Generated from lightning_hybrid/strategies/ssp.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import dataclasses
import inspect
import math
import os
import warnings
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities.data import _update_dataloader
from torch.utils.data import Sampler, SequentialSampler
from lightning_hybrid.comm.flat import gradients
from lightning_hybrid.parameter_server.client import PullInfo
from lightning_hybrid.parameter_server.dispenser import chunks_per_epoch, segment_chunks
from lightning_hybrid.parameter_server.gradient_mask import has_gradient
from lightning_hybrid.parameter_server.protocol import DatasetShape
from lightning_hybrid.parameter_server.sync_controller import validate_staleness
from lightning_hybrid.parameter_server.update_rule import UpdateRule
from lightning_hybrid.lightning.strategies import common
from lightning_hybrid.lightning.strategies.parameter_server import ParameterServerStrategy, WorkerEpochStats
from lightning_hybrid.lightning.strategies.step_count import ServerSteps
__all__ = ['SSPStrategy', 'ServerSampler', 'WorkerEpochStats']
STOCK = ...

class ServerSampler(Sampler[int]):

    def __init__(self, strategy: SSPStrategy) -> None:
        ...

    def __iter__(self) -> Iterator[int]:
        ...

class SSPStrategy(ParameterServerStrategy):
    strategy_name = ...
    aliases = ...
    metrics_prefix = ...
    validates_mid_epoch = ...

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        ...

    def __init__(self, staleness: float | int=3, sync: str='delay', timeout: float=300.0, pushes_per_update: int | None=None, staleness_lr: bool=True, momentum_correction: bool | str=True, restart_steps: int=10, overlap: bool=False, step_patience: float=1.0, batch_mode: bool=False, **kwargs: Any) -> None:
        ...

    def _update_rule(self) -> dict[str, Any]:
        ...

    def check_val_check_interval(self, trainer: pl.Trainer) -> None:
        ...

    def setup(self, trainer: pl.Trainer) -> None:
        ...

    def check_training_data(self, loader: object) -> None:
        ...

    def process_dataloader(self, dataloader: object) -> object:
        ...

    def _epoch_chunks(self, samples: int, batch_size: int, drop_last: bool) -> int | None:
        ...

    def _start_data_epoch(self, epoch: int) -> None:
        ...

    def _yielded(self, chunk: tuple[torch.Tensor, int]) -> None:
        ...

    def _segment_ended(self, batch_idx: int) -> bool:
        ...

    def _next_chunk(self, epoch: int) -> tuple[torch.Tensor, int] | None:
        ...

    def _count_samples(self, samples: int) -> None:
        ...

    def _replaced_step(self, optimizer: torch.optim.Optimizer) -> None:
        ...

    def _settle(self) -> None:
        ...

    def _received(self, info: PullInfo, loaded: bool=False) -> None:
        ...

    def _pull_at_sync(self) -> None:
        ...

    def _begin_async_phase(self) -> None:
        ...

    def _before_sync(self) -> None:
        ...

    def teardown(self) -> None:
        ...
