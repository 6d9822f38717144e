"""Lightning glue shared by the suite's strategies: pre-launch checks and a replaced optimizer step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.strategies.launchers import _SubprocessScriptLauncher
from pytorch_lightning.trainer.states import TrainerFn


class CheckingLauncher(_SubprocessScriptLauncher):
    """Lightning's subprocess launcher that first calls ``strategy.check_trainer(trainer, model)``,
    so that a run the strategy cannot do fails before any other process starts."""

    def __init__(self, strategy: Any, *args: Any) -> None:
        super().__init__(*args)
        self.strategy = strategy

    def launch(self, function: Callable, *args: Any, trainer: pl.Trainer | None = None, **kwargs: Any) -> Any:
        if trainer is not None and trainer.state.fn == TrainerFn.FITTING:
            model = args[0] if args and isinstance(args[0], pl.LightningModule) else None
            self.strategy.check_trainer(trainer, model)
        return super().launch(function, *args, trainer=trainer, **kwargs)


def refuse_manual_optimization(name: str, model: pl.LightningModule | None, why: str) -> None:
    if model is not None and not model.automatic_optimization:
        raise ValueError(f"{name} supports automatic optimization only ({why}).")


def refuse_mid_epoch_checkpoints(name: str, trainer: pl.Trainer) -> None:
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint) and (
            callback._every_n_train_steps or callback._train_time_interval is not None
        ):
            raise ValueError(
                f"{name} saves checkpoints at epoch ends only (its sync points); ModelCheckpoint has "
                "every_n_train_steps or train_time_interval set. Use every_n_epochs."
            )


def refuse_grad_scaler(name: str, precision_plugin: Any) -> None:
    if getattr(precision_plugin, "scaler", None) is not None:
        raise ValueError(f"{name} does not support fp16 with a gradient scaler; use precision='bf16-mixed' or 32.")


class ReplacedStep:
    """What Lightning's precision plugin steps instead of the optimizer: run the closure (forward,
    backward, gradient clipping), then ``step_fn(optimizer)`` does what the strategy does instead
    of ``optimizer.step()``. Every other attribute is the optimizer's."""

    def __init__(self, optimizer: torch.optim.Optimizer, step_fn: Callable[[torch.optim.Optimizer], None]) -> None:
        self._optimizer = optimizer
        self._step_fn = step_fn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = closure() if closure is not None else None
        self._step_fn(self._optimizer)
        return loss


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside a LightningOptimizer (or the optimizer itself)."""
    return getattr(optimizer, "_optimizer", optimizer)
