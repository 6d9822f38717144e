# Generated from lightning_hybrid/classifier.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""A classification LightningModule whose network, optimizer and LR scheduler come from config."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F
from torchmetrics.classification import MulticlassAccuracy

from lightning_hybrid.metrics import DiagnosisMetrics

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]


class ClassifierModule(pl.LightningModule):
    """Cross-entropy classification of any ``net`` with accuracy metrics.

    Args:
        net: the network; it maps a batch of inputs to logits of shape ``(batch, num_classes)``.
        optimizer: a factory that takes the parameters and returns an optimizer, e.g.
            ``functools.partial(torch.optim.SGD, lr=0.01)`` (Hydra: ``_partial_: true``).
            ``None`` means SGD with lr 0.01.
        scheduler: ``None``; a factory that takes the optimizer and returns an LR scheduler; or a
            Lightning lr-scheduler mapping whose ``"scheduler"`` entry is such a factory, e.g.
            ``{"scheduler": partial(StepLR, step_size=1), "interval": "epoch", "monitor": "val/loss"}``.
        num_classes: number of classes; defaults to ``net.num_classes``.
        positive_class: for two classes, the index of the disease (the class sensitivity and AUC are
            of); ``None`` takes the datamodule's ``positive_class`` (ADNI: 0, ClinicaDL's order), else 1.

    Logs ``train/loss``, ``train/acc``, ``val/loss``, ``val/acc``, ``test/loss`` and ``test/acc``;
    with two classes also, for validation and test, ``bacc`` (balanced accuracy), ``sensitivity``,
    ``specificity`` and ``auc`` per scan, and the same per subject (``val/subject/bacc``, ...) when
    the evaluation batches carry keys (``(x, y, key)``, as ADNI's do:
    :class:`~lightning_hybrid.metrics.DiagnosisMetrics`). ``predict_step`` returns the predicted
    class of each input.

    Examples:
        >>> from functools import partial
        >>> import torch
        >>> from lightning_hybrid import ClassifierModule
        >>> from lightning_hybrid.models import LeNet5
        >>> module = ClassifierModule(LeNet5(), optimizer=partial(torch.optim.Adam, lr=1e-3))
        >>> module(torch.zeros(2, 1, 28, 28)).shape  # logits
        torch.Size([2, 10])
        >>> type(module.configure_optimizers()).__name__
        'Adam'
        >>> # pl.Trainer(max_epochs=1).fit(module, datamodule=MNISTDataModule("data/mnist"))
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | Mapping[str, Any] | None = None,
        num_classes: int | None = None,
        positive_class: int | None = None,
    ) -> None:
        super().__init__()
        if num_classes is None:
            num_classes = getattr(net, "num_classes", None)
            if num_classes is None:
                raise ValueError(
                    f"{type(net).__name__} has no `num_classes` attribute; pass num_classes= to ClassifierModule"
                )
        if scheduler is not None and not callable(scheduler):
            if not isinstance(scheduler, Mapping) or not callable(scheduler.get("scheduler")):
                raise TypeError(
                    "scheduler must be a factory taking the optimizer, or a mapping with a 'scheduler' factory "
                    f"and Lightning's lr-scheduler keys (interval, frequency, monitor); got {scheduler!r}"
                )
        # `net` is saved in the state dict. The factories stay out of the checkpoint so that it loads with
        # torch.load(weights_only=True); the CLI logs the whole config instead.
        self.save_hyperparameters(ignore=["net", "optimizer", "scheduler"], logger=False)
        self.net = net
        self.num_classes = num_classes
        self.optimizer_factory = optimizer
        self.scheduler_config = scheduler
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self.positive_class = positive_class
        self.diagnosis = {"val": DiagnosisMetrics(), "test": DiagnosisMetrics()} if num_classes == 2 else {}
        for stage, metrics in self.diagnosis.items():
            self.add_module(f"{stage}_diagnosis", metrics)  # moved to the module's device with it

    def setup(self, stage: str) -> None:
        """The disease class: as given, else the datamodule's ``positive_class``, else 1."""
        positive = self.positive_class
        if positive is None:
            datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
            positive = getattr(datamodule, "positive_class", 1)
        for metrics in self.diagnosis.values():
            metrics.positive_class = int(positive)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def _shared_step(self, batch: Any, stage: str, accuracy: MulticlassAccuracy) -> torch.Tensor:
        x, y = batch[0], batch[1]
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        on_step = stage == "train"
        sync = stage != "train"
        self.log(f"{stage}/loss", loss, on_step=on_step, on_epoch=True, prog_bar=True, sync_dist=sync)
        if stage in self.diagnosis:  # accuracy among the diagnosis metrics, each scan counted once
            self.diagnosis[stage].update(logits, y, batch[2] if len(batch) > 2 else None)
        else:
            accuracy(logits, y)
            self.log(f"{stage}/acc", accuracy, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def _log_diagnosis(self, stage: str) -> None:
        """The epoch's diagnosis metrics (gathered from every process by torchmetrics, so the same on every
        rank: ``sync_dist`` averages equal values), then a fresh start."""
        if stage not in self.diagnosis or self.diagnosis[stage].update_count == 0:
            return
        values = self.diagnosis[stage].compute()
        self.diagnosis[stage].reset()
        for name, value in values.items():
            self.log(f"{stage}/{name}", value.to(self.device), prog_bar=name in ("acc", "bacc"), sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        self._log_diagnosis("val")

    def on_test_epoch_end(self) -> None:
        self._log_diagnosis("test")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._shared_step(batch, "train", self.train_acc)

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._shared_step(batch, "val", self.val_acc)

    def test_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._shared_step(batch, "test", self.test_acc)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self(x).argmax(dim=1)

    # ------------------------------------------------------------------ pipelining (HybridParallelStrategy)
    def pipeline_blocks(self) -> nn.Sequential:
        """The network's blocks, for pipeline parallelism (``net`` must be an ``nn.Sequential``)."""
        if not isinstance(self.net, nn.Sequential):
            raise TypeError(
                f"{type(self.net).__name__} is not an nn.Sequential of blocks, so it cannot be cut into pipeline "
                "stages; build the network as an nn.Sequential (as LeNet5, MLP and ResAttNet3D are)"
            )
        return self.net

    def pipeline_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target)

    def on_pipeline_step(self, output: torch.Tensor, target: torch.Tensor, loss: torch.Tensor) -> None:
        self.train_acc(output, target)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)

    def configure_optimizers(self) -> Any:
        factory = self.optimizer_factory or (lambda params: torch.optim.SGD(params, lr=0.01))
        optimizer = factory(self.parameters())
        if self.scheduler_config is None:
            return optimizer
        if callable(self.scheduler_config):
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.scheduler_config(optimizer)}}
        lr_scheduler = dict(self.scheduler_config)
        lr_scheduler["scheduler"] = lr_scheduler["scheduler"](optimizer)
        return {"optimizer": optimizer, "lr_scheduler": lr_scheduler}
