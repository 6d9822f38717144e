"""What a strategy refuses before it trains, each with what to change: data it cannot deal by index, manual
optimization, mid-epoch checkpoints, more than one optimizer, fp16's gradient scaler."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint



def refuse_unindexed_training_data(name: str, loader: object, why: str) -> None:
    """A TypeError, saying what to change, unless ``loader`` is a DataLoader over a map-style dataset
    (``__len__`` and ``__getitem__``: samples the strategy can deal by index)."""
    dataset = getattr(loader, "dataset", None)
    if isinstance(loader, torch.utils.data.DataLoader) and not isinstance(dataset, torch.utils.data.IterableDataset) \
            and hasattr(dataset, "__len__"):
        return
    kind = "an IterableDataset" if isinstance(dataset, torch.utils.data.IterableDataset) else "no __len__"
    got = f"a DataLoader over {type(dataset).__name__} ({kind})" if isinstance(loader, torch.utils.data.DataLoader) \
        else type(loader).__name__
    raise TypeError(
        f"{name} {why}, so the training data must be a torch DataLoader over a map-style dataset (with __len__ and "
        f"__getitem__); got {got}. Index the data (a Dataset whose __getitem__(i) reads sample i, e.g. from a list of "
        f"files), or train with strategy='ddp' or 'delayed_averaging', where an IterableDataset splits itself over the ranks."
    )


def refuse_manual_optimization(name: str, model: pl.LightningModule | None, why: str) -> None:
    if model is not None and not model.automatic_optimization:
        raise ValueError(f"{name} supports automatic optimization only ({why}).")


def refuse_mid_epoch_checkpoints(name: str, trainer: pl.Trainer, instead: str = "Use every_n_epochs.") -> None:
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint) and (
            callback._every_n_train_steps or callback._train_time_interval is not None
        ):
            raise ValueError(
                f"{name} saves checkpoints at its sync points only; ModelCheckpoint has every_n_train_steps or "
                f"train_time_interval set. {instead}"
            )


def single_optimizer(name: str, optimizers: list[torch.optim.Optimizer]) -> torch.optim.Optimizer:
    """The one optimizer of ``configure_optimizers``, or a ValueError saying the strategy needs exactly one."""
    if len(optimizers) != 1:
        raise ValueError(f"{name} supports exactly one optimizer, configure_optimizers returned {len(optimizers)}")
    return optimizers[0]


def refuse_grad_scaler(name: str, precision_plugin: Any) -> None:
    if getattr(precision_plugin, "scaler", None) is not None:
        raise ValueError(f"{name} does not support fp16 with a gradient scaler; use precision='bf16-mixed' or 32.")
