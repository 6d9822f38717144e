"""Fully sharded data parallelism over a model's blocks (torch's ``fully_shard``, FSDP2), on any device and
backend: what a user with a model too large for one device picks first, and the pipeline's contender.

Each block with parameters becomes one FSDP unit, then the model as a whole: every rank holds ``1/N`` of each
parameter, of its gradient and of the optimizer's state (ZeRO-3). Before a block runs forward (and again
before its backward) its parameters are all-gathered, and freed after it (``reshard_after_forward=True``);
with ``reshard_after_forward=False`` they stay gathered from the forward until the backward (ZeRO-2: one
all-gather a step, the whole model's parameters held while the step runs). Each block's gradient is
reduce-scattered after its backward, so a rank keeps only its shard: the average over the ranks, as DDP's.
The collectives run on the group's device (gloo on the CPU, NCCL on GPUs): torch 2.13's ``fully_shard``
trains on CPU ranks over gloo, where Lightning's ``FSDPStrategy`` and ``ModelParallelStrategy`` require CUDA.

Plain torch (no Lightning)::

    mesh = data_parallel_mesh()                       # every rank of the default group
    shard_blocks(model, blocks=list(model.net), mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters())  # over the shards
    ...
    state = full_state_dict(model)                     # the whole model, on rank 0 (for a checkpoint)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def data_parallel_mesh(device_type: str | None = None) -> Any:
    """A one-dimensional device mesh over every rank of the default group, on the device type its backend
    serves (``"cuda"`` for NCCL, else ``"cpu"``)."""
    from torch.distributed.device_mesh import init_device_mesh

    if device_type is None:
        device_type = "cuda" if "nccl" in str(dist.get_backend()) else "cpu"
    return init_device_mesh(device_type, (dist.get_world_size(),))


def shard_blocks(model: nn.Module, blocks: Iterable[nn.Module], mesh: Any, reshard_after_forward: bool = True) -> None:
    """Make each of ``blocks`` that holds parameters an FSDP unit, then ``model`` (its other parameters): every
    rank keeps its shard of each parameter (see the module docstring). In place."""
    from torch.distributed.fsdp import fully_shard

    for block in blocks:
        if next(block.parameters(), None) is not None:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)


def full_state_dict(model: nn.Module, on_every_rank: bool = False) -> dict[str, torch.Tensor]:
    """The whole model's state dict, gathered from the shards to the CPU (a collective: every rank calls it);
    on rank 0 alone unless ``on_every_rank`` (the others get an empty dict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=not on_every_rank)
    return get_model_state_dict(model, options=options)


def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Load a whole model's state dict (read by every rank from the same file) into the shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=strict))


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state over the whole model (parameter names as keys), gathered to rank 0's CPU."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
