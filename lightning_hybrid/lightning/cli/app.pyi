# Generated from lightning_hybrid/cli/app.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
import lightning.pytorch as pl
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning_hybrid.lightning import namespace
from lightning_hybrid.lightning.classifier import ClassifierModule
from lightning_hybrid.lightning.callbacks import ContinueCSVLog, HeterogeneitySimulator, MemoryBudget, ProgressLog, TransferWeights
from lightning_hybrid.cli.checks import check_checkpoint_readable, check_model_fits_data, check_optimizer
from lightning_hybrid.cli.relaunch import child_ranks_rerun_this_job, in_multirun
from lightning_hybrid.cli.resume import compared_config, record_end, record_start, resolve_ckpt_path
from lightning_hybrid.lightning.cli.slurm import submitit_task_as_rank, task_threads
from lightning_hybrid.lightning.preemption import Preemption, Stop
from lightning_hybrid.lightning.strategies.checkpoint_io import AtomicCheckpointIO
from lightning_hybrid.strategies.capabilities import capabilities_of
from lightning_hybrid.transfer import transfer_checkpoint
from lightning_hybrid.lightning.watchdog import Watchdog
log = ...

def _logical_workers(quota: Any) -> int:
    ...

def build(cfg: DictConfig, **kwargs: Any) -> Any:
    ...

def _translate_targets(node: Any) -> None:
    ...

def build_strategy(cfg: DictConfig) -> Any:
    ...

def resolve_fork_ranks(cfg: DictConfig) -> None:
    ...

def progress_as_lines(cfg: DictConfig, stream: Any=None) -> bool:
    ...
DEFAULT_MONITOR = ...

def build_callbacks(cfg: DictConfig, datamodule: Any=None) -> list[pl.Callback]:
    ...

def chosen(group: str) -> str:
    ...

def build_module(cfg: DictConfig) -> ClassifierModule:
    ...

def check_resources(cfg: DictConfig, trainer: pl.Trainer) -> None:
    ...

def warn_cpu_bf16_conv3d(trainer: pl.Trainer, module: torch.nn.Module) -> None:
    ...

def spread_processes_over_gpus(cfg: DictConfig, gpus: int) -> None:
    ...

def set_cpu_threads(cfg: DictConfig, trainer: pl.Trainer) -> None:
    ...

@contextmanager
def job_scope() -> Iterator[None]:
    ...

def final_metrics(trainer: pl.Trainer, prefix: str='') -> dict[str, float]:
    ...

def train(cfg: DictConfig) -> dict[str, float]:
    ...

def fit_and_test(cfg: DictConfig, trainer: pl.Trainer, module: pl.LightningModule, datamodule: Any, ckpt_path: str | None) -> tuple[dict[str, float], str]:
    ...
RANKS_END_S = ...

def end_stopped_run(cfg: DictConfig, trainer: pl.Trainer, stop: Stop, fitting: bool, ranks: list[Any]) -> None:
    ...

def report(metrics: Mapping[str, float], output_dir: Path, best_checkpoint: str) -> None:
    ...
