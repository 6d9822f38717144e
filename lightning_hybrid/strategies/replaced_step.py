"""The optimizer step a strategy does instead of ``optimizer.step()``, behind the optimizer Lightning's
precision plugin steps (plain: no Lightning)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


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
