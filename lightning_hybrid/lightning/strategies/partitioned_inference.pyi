# Generated from lightning_hybrid/strategies/partitioned_inference.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import logging
from collections.abc import Callable, Sequence
from typing import Any
import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from lightning_hybrid.comm.collectives import all_gather_object
from lightning_hybrid.devices import REFERENCE_ABILITY_FLOPS, macs_per_unit, positive_per_device, probe_speed
from lightning_hybrid.partition.spatial_executor import DistributedExecutor, LayerTraffic
from lightning_hybrid.partition.network import FC_PARTITIONS, PartitionPlan, plan_partition
from lightning_hybrid.partition.spatial import CONV_PARTITIONS, SPATIAL_LAYERS, PartitionError
from lightning_hybrid.pipeline.module_contract import pipeline_blocks
from lightning_hybrid.lightning.strategies.common import UnwrappedDDPStrategy
from lightning_hybrid.strategies.routed_evaluation import RoutedEvaluation
log = ...

def check_abilities(abilities: Sequence[float] | None, workers: int | None=None) -> list[float] | None:
    ...

class PartitionedInferenceStrategy(RoutedEvaluation, UnwrappedDDPStrategy):
    strategy_name = ...
    process_role = ...
    aliases = ...

    def __init__(self, abilities: Sequence[float] | None=None, conv_partition: str='bodp', fc_partition: str='mscc_fgcp', min_sparsity: float=0.5, **kwargs: Any) -> None:
        ...

    @property
    def num_workers(self) -> int:
        ...

    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        ...

    def check_evaluation(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        ...
    slows_its_compute = ...

    def inject_compute_slowdown(self, factor: float) -> None:
        ...

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        ...

    def setup(self, trainer: pl.Trainer) -> None:
        ...

    def _measured_abilities(self) -> list[float]:
        ...

    def _executor(self, sample_shape: tuple[int, ...]) -> DistributedExecutor:
        ...

    def routed_forward(self, blocks_seq: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        ...

    def gather_traffic(self) -> list[LayerTraffic]:
        ...

    def _report(self) -> None:
        ...

    def on_predict_end(self) -> None:
        ...

    def on_test_end(self) -> None:
        ...

    def on_validation_end(self) -> None:
        ...

    def teardown(self) -> None:
        ...

def format_traffic(rows: Sequence[LayerTraffic], title: str='') -> str:
    ...
