"""What training a whole model takes in one device's memory, part by part: the estimate a data-parallel
rank is checked against before training (:class:`~lightning_hybrid.callbacks.MemoryBudget`), and the
data-parallel rows of ``benchmarks/whole_brain_memory.py`` beside the pipeline's stage estimates.

The parts are those of one step of a data-parallel rank: the parameters; their gradients; the
optimizer's state (``optimizer_slots`` tensors a parameter: 0 for SGD, 1 with momentum, 2 for Adam);
DDP's gradient buckets (a flat copy of the gradients, ``buckets=True``); the activations autograd keeps
from the forward to the backward for one step's batch (with activation checkpointing only each block's
input, :mod:`lightning_hybrid.models.checkpointing`); and the largest transient: one block's activations
recomputed in its backward (checkpointed), or one parameter's gradient added into its accumulated
gradient. A rank of fully sharded data parallelism (``shards=N``: FSDP, ZeRO) holds ``1/N`` of the parameters,
gradients and optimizer state, no buckets, and the parameters it gathers: a block's and the next one's (prefetched)
when each block is resharded after its forward, the whole model's from the forward to the backward when not
(ZeRO-2); its transient is a block's whole gradient before it is reduce-scattered. Measured from the blocks on the meta device (:func:`~lightning_hybrid.placement.cost.trace_blocks`):
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
    gathered: float = 0.0  # fully sharded: the whole parameters a rank gathers besides its shards
    shards: int = 1

    @property
    def total(self) -> float:
        return (self.parameters + self.gradients + self.optimizer_state + self.buckets + self.gathered + self.activations
                + self.transient)

    def describe(self) -> str:
        """``parameters 244, gradients 244, ...`` (MiB)."""
        sharded = f" (1/{self.shards})" if self.shards > 1 else ""
        parts = [(f"parameters{sharded}", self.parameters), (f"gradients{sharded}", self.gradients),
                 (f"optimizer state{sharded}", self.optimizer_state), ("DDP's gradient buckets", self.buckets),
                 ("gathered parameters", self.gathered),
                 (f"activations of a batch of {self.batch_size}{' (checkpointed: block inputs)' if self.checkpointed else ''}",
                  self.activations),
                 ("recomputed block" if self.checkpointed else "largest block's gradient" if self.shards > 1
                  else "largest gradient added", self.transient)]
        return ", ".join(f"{name} {value / MiB:.0f}" for name, value in parts if value)


def training_memory(
    model: nn.Module | Iterable[tuple[str, nn.Module]],
    sample_shape: Sequence[int],
    batch_size: int,
    optimizer_slots: int,
    checkpointed: bool = False,
    buckets: bool = True,
    dtype: torch.dtype = torch.float32,
    shards: int = 1,
    reshard_after_forward: bool = True,
) -> TrainingMemory:
    """What one rank needs to train ``model`` (an ``nn.Sequential`` of blocks, or ``(name, block)`` pairs)
    on batches of ``batch_size`` samples of ``sample_shape``, by part (:class:`TrainingMemory`); with
    ``shards > 1`` a rank of fully sharded data parallelism over that many ranks (``reshard_after_forward``:
    FSDP's full sharding, else ZeRO-2), ``buckets`` then ignored.

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
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    parameters = sum(t.param_bytes for t in traces)
    buffers = sum(t.buffer_bytes for t in traces)
    activations = sum(t.held_bytes(checkpointed) for t in traces) - sum(t.shared_bytes(checkpointed) for t in traces[1:])
    if shards == 1:
        return TrainingMemory(
            parameters=parameters + buffers, gradients=parameters, optimizer_state=parameters * optimizer_slots,
            buckets=parameters if buckets else 0.0, activations=activations,
            transient=max(t.recompute_bytes(checkpointed) + t.largest_param_bytes for t in traces),
            batch_size=batch_size, checkpointed=checkpointed,
        )
    sizes = sorted((t.param_bytes for t in traces), reverse=True)
    return TrainingMemory(
        parameters=parameters / shards + buffers, gradients=parameters / shards,
        optimizer_state=parameters * optimizer_slots / shards, buckets=0.0,
        gathered=sum(sizes[:2]) if reshard_after_forward else parameters, activations=activations,
        transient=max(t.recompute_bytes(checkpointed) + t.param_bytes for t in traces),
        batch_size=batch_size, checkpointed=checkpointed, shards=shards,
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


class MemoryBudgetExceeded(ValueError):
    """A rank would need more memory to train than its budget allows."""
