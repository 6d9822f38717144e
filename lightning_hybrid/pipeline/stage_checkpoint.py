"""Checkpoints of a pipeline whose ranks hold only their own stage: the whole model's state gathered on
one rank, tensor by tensor from the rank that holds it, and each rank's part of a full checkpoint.

* :func:`block_holders`: which rank holds each block tensor (from the stages' block ranges).
* :func:`gather_state_dict`, :func:`gather_optimizer_state`: every rank of the pipeline calls them
  alike; each tensor (or optimizer state) travels once, point to point from its holder to the
  gathering rank, which alone gets the whole; never more than one tensor of another stage on its
  device at a time.
* :func:`own_part`: a full state dict as this rank loads it (another stage's entries its own meta tensors).

Plain torch.distributed through :mod:`lightning_hybrid.comm.collectives`: no Lightning.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from lightning_hybrid.comm.collectives import exchange, receive_object, send_object


def block_holders(blocks: Sequence[nn.Module], stages: Sequence[range], stage_rank: Callable[[int], int]) -> dict[int, int]:
    """``id(tensor)`` -> the global rank holding it, for every parameter and buffer of ``blocks``
    (``stages[i]`` the block indices of stage ``i``, held by rank ``stage_rank(i)``)."""
    holders: dict[int, int] = {}
    for index, stage in enumerate(stages):
        rank = stage_rank(index)
        for block in blocks[stage.start:stage.stop]:
            holders.update((id(t), rank) for t in [*block.parameters(), *block.buffers()])
    return holders


def gather_state_dict(module: nn.Module, holders: Mapping[int, int], rank: int, gatherer: int,
                      group: Any, device: torch.device) -> dict[str, torch.Tensor]:
    """``module``'s whole state dict in ``gatherer``'s CPU memory (the other ranks get ``{}``): a tensor
    held elsewhere (``holders``; absent: held by ``gatherer``) is sent to it over ``group``."""
    full: dict[str, torch.Tensor] = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        src = holders.get(id(tensor), gatherer)
        tensor = tensor.detach()
        if src != gatherer and rank == src:
            exchange([(tensor.contiguous(), gatherer)], [], group=group)
        elif src != gatherer and rank == gatherer:
            received = torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
            exchange([], [(received, src)], group=group)
            full[name] = received.cpu()
        elif rank == gatherer:
            full[name] = tensor.cpu().clone()
    return full


def gather_optimizer_state(state: dict[str, Any], params: Sequence[torch.Tensor], holders: Mapping[int, int],
                           rank: int, gatherer: int, group: Any) -> dict[str, Any]:
    """An optimizer's ``state_dict()`` (``state`` over ``params``, in its order) with every parameter's
    state on ``gatherer``, sent by the parameter's holder; the other ranks keep their own."""
    merged = {}
    for index, param in enumerate(params):
        src = holders.get(id(param), gatherer)
        value = state["state"].get(index)
        if src != gatherer and rank == src:
            send_object(_to_cpu(value), dst=gatherer, group=group)
        elif src != gatherer and rank == gatherer:
            value = receive_object(src=src, group=group)
        if value is not None:
            merged[index] = value
    return {**state, "state": merged} if rank == gatherer else state


def own_part(state: Mapping[str, Any], current: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """A full state dict for this rank to load (``current``: its module's state dict with ``keep_vars``; another
    stage's tensors are on the meta device): the entries it holds, another stage's replaced by its own meta
    tensor, whose load copies nothing (left out, BatchNorm would fill in a ``num_batches_tracked`` of 0 and torch
    warn, for each, of a copy into a meta tensor)."""
    return {k: current[k] if k in current and current[k].is_meta else v for k, v in state.items()}


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value
