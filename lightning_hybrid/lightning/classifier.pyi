# Generated from lightning_hybrid/classifier.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
from collections.abc import Callable, Iterable, Mapping
from typing import Any
import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F
from torchmetrics.classification import MulticlassAccuracy
from lightning_hybrid.metrics import DiagnosisMetrics
OptimizerFactory = ...
SchedulerFactory = ...

class ClassifierModule(pl.LightningModule):

    def __init__(self, net: nn.Module, optimizer: OptimizerFactory | None=None, scheduler: SchedulerFactory | Mapping[str, Any] | None=None, num_classes: int | None=None, positive_class: int | None=None) -> None:
        ...

    def setup(self, stage: str) -> None:
        ...

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ...

    def _shared_step(self, batch: Any, stage: str, accuracy: MulticlassAccuracy) -> torch.Tensor:
        ...

    def _log_diagnosis(self, stage: str) -> None:
        ...

    def on_validation_epoch_end(self) -> None:
        ...

    def on_test_epoch_end(self) -> None:
        ...

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        ...

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        ...

    def test_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        ...

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int=0) -> torch.Tensor:
        ...

    def pipeline_blocks(self) -> nn.Sequential:
        ...

    def pipeline_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        ...

    def on_pipeline_step(self, output: torch.Tensor, target: torch.Tensor, loss: torch.Tensor) -> None:
        ...

    def configure_optimizers(self) -> Any:
        ...
