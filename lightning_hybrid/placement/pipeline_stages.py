"""Where a model's pipeline stages go: its blocks profiled on one micro-batch and placed on devices.

:func:`plan_stages` profiles the blocks (FLOPs and memory from meta copies, so no memory whatever the
model's size; or timed for real, ``method="time"``) and places them with a method of
:mod:`lightning_hybrid.placement` (``"gabra"``, ``"exact"``, ...) or at given stage sizes. Used by
:class:`~lightning_hybrid.HybridParallelStrategy` (rank 0 plans, every rank adopts); plain torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lightning_hybrid.devices import Device, probe_speed
from lightning_hybrid.pipeline.materialize import is_freed, meta_copy
from lightning_hybrid.placement import Placement, plan, profile_blocks
from lightning_hybrid.placement.problem import InfeasiblePlacementError, Problem, memory_table


def plan_stages(
    container: torch.nn.Module,
    example: torch.Tensor,
    devices: Sequence[Device],
    method: str | Sequence[int],
    stages: int,
    objective: str,
    seed: int,
    options: Mapping[str, Any],
    optimizer_slots: int,
    in_flight: int,
    checkpointed: bool = False,
    held_messages: int = 0,
) -> Placement:
    """Place the blocks of ``container`` (its children, in order) in ``stages`` stages on ``devices``.

    ``example`` is one micro-batch (only its shape matters unless ``method="time"``, which times the real
    blocks and so needs them materialised); ``method`` a placement method's name, or the stage sizes in
    blocks; ``in_flight`` the micro-batches whose activations a stage holds at once; ``held_messages`` the
    copies of its input and output it keeps for its messages (:class:`~lightning_hybrid.placement.Problem`); ``checkpointed``
    whether the stages recompute their blocks' activations in backward (only the blocks' inputs held).
    ``options["block_cost"] = "time"`` gives a method each block's measured time instead of its counted FLOPs
    (timed here, as ``method="time"`` does, in FLOP-equivalents of this device's probed speed, so that the
    devices' speeds still divide it): for blocks whose FLOPs run at different rates. A placement that
    fits no device's memory is refused with the memory table of blocks and devices. With ``method="time"``, an
    ``example`` on the meta device (a shape given before any batch: ``input_shape``) is timed on values made for it.
    """
    named = list(container.named_children())
    options = dict(options)
    block_cost = options.pop("block_cost", "flops")
    if block_cost not in ("flops", "time"):
        raise ValueError(f"placement_options.block_cost must be 'flops' or 'time', got {block_cost!r}")
    timed = method == "time" or block_cost == "time"
    if timed and any(is_freed(block) for _, block in named):
        raise ValueError("placement='time' and block_cost='time' time the real blocks, but the model is on the meta "
                         "device (configure_model()); count FLOPs instead, or build the model in __init__")
    was_training = [block.training for _, block in named]
    # Profiling runs backward: the first batch may be validation's (sanity check), under inference mode.
    with torch.inference_mode(False), torch.enable_grad():
        pairs = named if timed else [(name, meta_copy(block)) for name, block in named]
        micro_batch = len(example)
        if not timed:  # shapes only; at least 2 samples (BatchNorm in training mode refuses one per channel), scaled back
            example = torch.empty(max(len(example), 2), *example.shape[1:], dtype=example.dtype, device="meta")
        elif example.is_meta:  # a shape given before any batch (input_shape): real values to time the blocks on
            device = next((t.device for _, b in named for t in b.parameters()), torch.device("cpu"))
            example = torch.randn(example.shape, device=device).to(example.dtype) if example.is_floating_point() \
                else torch.zeros(example.shape, dtype=example.dtype, device=device)
        else:
            example = example.clone()
        for _, block in pairs:
            block.train()
        blocks = profile_blocks(pairs, example, optimizer_slots=optimizer_slots, measure_time=timed, repeats=2,
                                in_flight=in_flight, checkpointed=checkpointed, batch_size=micro_batch)
    for (_, block), training in zip(named, was_training):
        block.train(training)
    if block_cost == "time":  # seconds here x this device's FLOP/s: the units the devices' speeds divide
        reference = probe_speed(example.device)
        blocks = [dataclasses.replace(b, cost=b.time * reference) for b in blocks]
    devices = list(devices)
    try:
        if isinstance(method, str):
            return plan(blocks, devices, method=method, objective=objective, stages=stages, seed=seed,
                        held_messages=held_messages, **options)
        edges = [0]
        for size in method:
            edges.append(edges[-1] + size)
        placement = Problem(blocks, devices, stages, held_messages).placement("given", list(range(stages)), list(zip(edges[:-1], edges[1:])))
    except InfeasiblePlacementError as error:
        raise InfeasiblePlacementError(f"{error}\n{memory_table(blocks, devices, stages)}") from None
    if not placement.feasible:
        raise InfeasiblePlacementError(f"the given stage sizes {list(method)} do not fit the devices' memory:\n"
                                       + memory_table(blocks, devices, stages, placement))
    return placement
