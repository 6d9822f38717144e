# Generated from lightning_hybrid/strategies/hybrid.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import logging
from collections.abc import Callable, Sequence
from typing import Any
import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.pytorch.overrides.distributed import _sync_module_states
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from lightning_hybrid.comm.collectives import all_gather_object, broadcast_module_, broadcast_object
from lightning_hybrid.comm.delayed_allreduce import DelayedAllReduce
from lightning_hybrid.devices import Device, PeakMemory, devices_in_flops, free_memory, probe_speed, held_bytes
from lightning_hybrid.pipeline import Mesh, PipelineParallel, StageModule, pipeline_blocks, pipeline_inputs, pipeline_loss
from lightning_hybrid.pipeline.materialize import is_freed
from lightning_hybrid.pipeline.stage_adoption import meta_outside_blocks
from lightning_hybrid.pipeline.stage_executor import describe_stage_times, stage_time_metrics
from lightning_hybrid.placement import Placement
from lightning_hybrid.placement.figure import placement_summary
from lightning_hybrid.placement.pipeline_options import check_pipeline_options, check_stage_sizes
from lightning_hybrid.placement.pipeline_stages import plan_pipeline, within_budgets
from lightning_hybrid.lightning.strategies import common
from lightning_hybrid.lightning.strategies.even_batches import refuse_uneven_loaders
from lightning_hybrid.lightning.strategies.placement_logging import log_placement
from lightning_hybrid.strategies.routed_evaluation import RoutedEvaluation
from lightning_hybrid.lightning.strategies.stage_state import StageOnlyState
log = ...

class HybridParallelStrategy(StageOnlyState, RoutedEvaluation, common.UnwrappedDDPStrategy):
    strategy_name = ...
    process_role = ...
    logs_peak_memory = ...
    aliases = ...

    def __init__(self, pipeline_stages: int=2, data_parallel: int=1, placement: str | Sequence[int]='gabra', schedule: str='1F1B', micro_batches: int | str='auto', devices: Sequence[Any] | None=None, objective: str='bottleneck', placement_options: dict | None=None, seed: int=0, gradient_sync: str='sync', delay: int=1, input_shape: Sequence[int] | None=None, optimizer_slots: int=1, **kwargs: Any) -> None:
        ...

    @property
    def resumes_mid_epoch(self) -> bool:
        ...

    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        ...

    def _check_module(self, model: pl.LightningModule) -> None:
        ...

    def _batch_hint(self, trainer: pl.Trainer) -> int:
        ...
    slows_its_compute = ...
    holds_part_of_the_model = ...

    def limit_memory(self, limit_bytes: float | list[float]) -> None:
        ...

    def inject_compute_slowdown(self, factor: float) -> None:
        ...

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        ...

    def on_train_start(self) -> None:
        ...

    def setup(self, trainer: pl.Trainer) -> None:
        ...

    def _setup_stage(self, trainer: pl.Trainer) -> None:
        ...

    def _given_devices_in_flops(self) -> list[Device]:
        ...

    def _probe_devices(self) -> list[Device]:
        ...

    def _plan(self, module: pl.LightningModule, batch: torch.Tensor, devices: list[Device]) -> Placement:
        ...

    def _agreed_placement(self, module: pl.LightningModule, batch: torch.Tensor) -> Placement:
        ...

    def _adopt(self, placement: Placement) -> None:
        ...

    def _ensure_pipeline(self, inputs: torch.Tensor) -> PipelineParallel:
        ...

    def _log_placement(self, devices: list[Device], names: list[str]) -> None:
        ...

    @property
    def stage_module(self) -> StageModule | None:
        ...

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        ...

    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        ...

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any=None, **kwargs: Any) -> Any:
        ...

    def _replica_exchange(self) -> DelayedAllReduce:
        ...

    def _exchange_and_step(self, optimizer: torch.optim.Optimizer) -> None:
        ...

    def on_epoch_start(self, trainer: pl.Trainer) -> None:
        ...

    def sync_point(self) -> None:
        ...

    def on_sync_end(self) -> None:
        ...

    def after_epoch_sync(self, pl_module: pl.LightningModule) -> None:
        ...

    def _wrap_gradient_clipping(self) -> None:
        ...

    def routed_forward(self, blocks_seq: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        ...

    def teardown(self) -> None:
        ...

def _builds_in_configure_model(model: pl.LightningModule) -> bool:
    ...
