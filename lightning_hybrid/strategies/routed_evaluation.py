"""Validation, test and predict steps that run the module's block sequence (``pipeline_blocks()``) another
way than its own forward: a pipeline's, or a partition across devices.

A strategy takes the three steps from :func:`routed_steps` (composition, not a base class), naming the
strategy base whose steps they wrap, and defines ``routed_forward(blocks_seq)``::

    class MyStrategy(CheckedDDPStrategy):
        validation_step, test_step, predict_step = routed_steps(CheckedDDPStrategy)

        def routed_forward(self, blocks_seq):
            return my_forward   # replaces blocks_seq.forward while a step runs
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from lightning_hybrid.pipeline.module_contract import pipeline_blocks


@contextmanager
def routed_blocks(module: torch.nn.Module, forward: Callable[[torch.nn.Module], Callable[..., Any]]) -> Iterator[None]:
    """While inside, ``module``'s block sequence runs ``forward(blocks_seq)`` as its ``forward``: the module's own
    step logic (loss, metrics, argmax) stays, its blocks run the routed way."""
    blocks_seq = pipeline_blocks(module)
    blocks_seq.forward = forward(blocks_seq)  # instance attribute: nn.Module calls it
    try:
        yield
    finally:
        del blocks_seq.forward


def routed_steps(base: type) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """``validation_step``, ``test_step`` and ``predict_step`` for a strategy class whose ``routed_forward(
    blocks_seq)`` returns the function that replaces the block sequence's ``forward`` during each: ``base``'s
    step inside :func:`routed_blocks`."""

    def routed(hook: str) -> Callable[..., Any]:
        def step(self: Any, *args: Any, **kwargs: Any) -> Any:
            with routed_blocks(self.lightning_module, self.routed_forward):
                return getattr(base, hook)(self, *args, **kwargs)

        step.__name__ = step.__qualname__ = hook
        step.__doc__ = f"{base.__name__}'s {hook}, the module's blocks run by ``routed_forward``."
        return step

    return routed("validation_step"), routed("test_step"), routed("predict_step")
