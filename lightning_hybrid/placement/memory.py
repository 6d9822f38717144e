"""What training a whole model takes in one device's memory, part by part: the estimate a data-parallel
rank is checked against before training (:class:`~lightning_hybrid.callbacks.MemoryBudget`), and the
data-parallel rows of ``benchmarks/whole_brain_memory.py`` beside the pipeline's stage estimates.

The parts are those of one step of a data-parallel rank: the parameters; their gradients; the
optimizer's state (``optimizer_slots`` tensors a parameter: 0 for SGD, 1 with momentum, 2 for Adam);
DDP's gradient buckets (a flat copy of the gradients, ``buckets=True``); the activations autograd keeps
from the forward to the backward for one step's batch (with activation checkpointing only each block's
input, :mod:`lightning_hybrid.models.checkpointing`); and the largest transient: one block's activations
recomputed in its backward (checkpointed), or one parameter's gradient added into its accumulated
gradient. Measured from the blocks on the meta device (:func:`~lightning_hybrid.placement.cost.trace_blocks`):
no memory, no compute, whatever the model's size. Plain torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from lightning_hybrid.pipeline.materialize import meta_copy
from lightning_hybrid.placement.cost import named_blocks, trace_blocks

MiB = 2**20


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes one rank needs to train a whole model, by part; :attr:`total` is their sum."""

    parameters: float
    gradients: float
    optimizer_state: float
    buckets: float
    activations: float
    transient: float
    batch_size: int
    checkpointed: bool

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer_state + self.buckets + self.activations + self.transient

    def describe(self) -> str:
        """``parameters 244, gradients 244, ...`` (MiB)."""
        parts = [("parameters", self.parameters), ("gradients", self.gradients), ("optimizer state", self.optimizer_state),
                 ("DDP's gradient buckets", self.buckets),
                 (f"activations of a batch of {self.batch_size}{' (checkpointed: block inputs)' if self.checkpointed else ''}",
                  self.activations),
                 ("recomputed block" if self.checkpointed else "largest gradient added", self.transient)]
        return ", ".join(f"{name} {value / MiB:.0f}" for name, value in parts if value)


def training_memory(
    model: nn.Module | Iterable[tuple[str, nn.Module]],
    sample_shape: Sequence[int],
    batch_size: int,
    optimizer_slots: int,
    checkpointed: bool = False,
    buckets: bool = True,
    dtype: torch.dtype = torch.float32,
) -> TrainingMemory:
    """What one rank needs to train ``model`` (an ``nn.Sequential`` of blocks, or ``(name, block)`` pairs)
    on batches of ``batch_size`` samples of ``sample_shape``, by part (:class:`TrainingMemory`).

    The blocks are copied to the meta device first (the model's own tensors are not touched).

    Example::

        >>> from lightning_hybrid.models import LeNet5
        >>> need = training_memory(LeNet5(), (1, 28, 28), batch_size=64, optimizer_slots=1)
        >>> need.gradients == need.parameters == need.buckets, need.optimizer_state == need.parameters
        (True, True)
        >>> need.activations < training_memory(LeNet5(), (1, 28, 28), 128, 1).activations
        True
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    pairs = [(name, meta_copy(block)) for name, block in named_blocks(model)]
    for _, block in pairs:
        block.train()
    # at least 2 samples on the meta device (BatchNorm refuses one value per channel), scaled to the batch
    example = torch.empty(max(batch_size, 2), *sample_shape, dtype=dtype, device="meta")
    with torch.inference_mode(False), torch.enable_grad():
        traces = [trace for _, trace in trace_blocks(pairs, example, batch_size=batch_size)]
    parameters = sum(t.param_bytes for t in traces)
    buffers = sum(t.buffer_bytes for t in traces)
    return TrainingMemory(
        parameters=parameters + buffers,
        gradients=parameters,
        optimizer_state=parameters * optimizer_slots,
        buckets=parameters if buckets else 0.0,
        activations=sum(t.held_bytes(checkpointed) for t in traces) - sum(t.shared_bytes(checkpointed) for t in traces[1:]),
        transient=max(t.recompute_bytes(checkpointed) + t.largest_param_bytes for t in traces),
        batch_size=batch_size,
        checkpointed=checkpointed,
    )


def optimizer_slots(optimizer: torch.optim.Optimizer) -> int:
    """State tensors ``optimizer`` keeps a parameter: 0 for plain SGD, 1 for SGD with momentum (and
    one-moment methods), 2 for Adam/AdamW (and others, counted as 2 when unknown, erring on the safe side)."""
    if isinstance(optimizer, torch.optim.SGD):
        return int(any(group.get("momentum", 0) for group in optimizer.param_groups))
    if isinstance(optimizer, (torch.optim.Adagrad, torch.optim.RMSprop)):
        return 1 + int(any(group.get("momentum", 0) or group.get("centered", False)
                           for group in optimizer.param_groups if isinstance(optimizer, torch.optim.RMSprop)))
    return 2
