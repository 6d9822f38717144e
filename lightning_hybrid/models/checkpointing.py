"""Activation checkpointing of a network's blocks: each block keeps only its input for backward and
recomputes its activations there (``torch.utils.checkpoint``, non-reentrant), trading a second forward
of each block for the memory of everything it saved.

:class:`Blocks` is the ``nn.Sequential`` the suite's networks derive from (``LeNet5``, ``MLP``, ``VGG16``,
``ResAttNet3D``): ``checkpoint_blocks=True`` (``model.checkpoint_blocks=true`` on the command line) runs
each block checkpointed while gradients are recorded; :func:`run_blocks` does the same for any run of
blocks (a pipeline stage's). Plain torch: no Lightning here.

BatchNorm in a recomputed block would update its running statistics twice a step (forward and
recomputation), doubling their momentum; the recomputation here leaves them as the forward left them,
so that a checkpointed run's weights, gradients *and* running statistics are the plain run's.

Example::

    >>> import torch
    >>> from lightning_hybrid.models import LeNet5
    >>> net = LeNet5(checkpoint_blocks=True)
    >>> net(torch.zeros(2, 1, 28, 28)).sum().backward()
    >>> net.c1[0].weight.grad.shape
    torch.Size([6, 1, 5, 5])
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint


@contextlib.contextmanager
def _statistics_frozen(block: nn.Module) -> Iterator[None]:
    """BatchNorm's running statistics (and its batch count) as they were before: the recomputation's
    update undone, so that a step updates them once."""
    saved = [(buffer, buffer.clone()) for m in block.modules()
             if isinstance(m, _BatchNorm) and m.track_running_stats and m.training
             for buffer in (m.running_mean, m.running_var, m.num_batches_tracked) if buffer is not None]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


def run_checkpointed(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``block(x)``, keeping only ``x`` for backward, which recomputes the block's activations."""
    return checkpoint(block, x, use_reentrant=False,
                      context_fn=lambda: (contextlib.nullcontext(), _statistics_frozen(block)))


def run_blocks(blocks: Iterable[nn.Module], x: torch.Tensor, checkpointed: bool) -> torch.Tensor:
    """``x`` through ``blocks`` in order; each checkpointed where ``checkpointed`` and gradients are recorded
    (evaluation and ``torch.no_grad()`` run plainly: there is nothing to keep)."""
    recompute = checkpointed and torch.is_grad_enabled()
    for block in blocks:
        x = run_checkpointed(block, x) if recompute else block(x)
    return x


class Blocks(nn.Sequential):
    """An ``nn.Sequential`` of named blocks that can run each block checkpointed (:attr:`checkpoint_blocks`)."""

    #: Recompute each block's activations in backward instead of keeping them (set by the networks'
    #: ``checkpoint_blocks`` argument; may be changed at any time).
    checkpoint_blocks: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return run_blocks(self, x, self.checkpoint_blocks)
