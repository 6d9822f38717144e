# Generated from lightning_hybrid/callbacks/simulator.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import logging
import multiprocessing
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any
import lightning.pytorch as pl
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from lightning_hybrid.lightning.strategies.parameter_server import ParameterServerStrategy
from lightning_hybrid.strategies.capabilities import capabilities_of
from lightning_hybrid.sim.contention import check_cores
from lightning_hybrid.sim.cpu_share import CpuShare
from lightning_hybrid.sim.latency import CollectiveLatency, latent_allreduce_hook
from lightning_hybrid.sim.slowdown import SlowBatches, StepStretcher, check_where
log = ...
CALIBRATION_STEPS = ...

class HeterogeneitySimulator(pl.Callback):

    def __init__(self, slowdown: Sequence[float] | None=None, straggle_prob: float=0.0, straggle_factor: float=3.0, seed: int=0, collective_latency_s: float=0.0, collective_in_flight: int | None=None, collective_bytes_per_s: float | None=None, where: str='compute', affinity: Sequence[Sequence[int] | None] | None=None, cpu_share: Sequence[float | None] | None=None) -> None:
        ...

    @property
    def active(self) -> bool:
        ...

    def check_world_size(self, world_size: int) -> None:
        ...

    def check_strategy(self, strategy: Any) -> None:
        ...

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        ...

    def _slow_the_training_dataloaders(self, strategy: Any) -> None:
        ...

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ...

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        ...

    @staticmethod
    def _wall_minus_waits(trainer: pl.Trainer) -> Any:
        ...

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        ...

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        ...

    def _calibrate(self, per_sample: float) -> None:
        ...
