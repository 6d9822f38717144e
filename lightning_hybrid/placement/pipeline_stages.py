"""Where a model's pipeline stages go: its blocks profiled on one micro-batch and placed on devices.

:func:`plan_stages` profiles the blocks (FLOPs and memory from meta copies, so no memory whatever the
model's size; or timed for real, ``method="time"``) and places them with a method of
:mod:`lightning_hybrid.placement` (``"gabra"``, ``"exact"``, ...) or at given stage sizes. :func:`plan_pipeline`
also chooses the micro-batch count (``None``: the candidates' shortest predicted step) and
:func:`within_budgets` caps the devices' memory at a budget. Used by
:class:`~lightning_hybrid.HybridParallelStrategy` (rank 0 plans, every rank adopts); plain torch.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lightning_hybrid.devices import Device, probe_speed
from lightning_hybrid.pipeline.materialize import is_freed, meta_copy
from lightning_hybrid.pipeline.parallel import micro_batch_count
from lightning_hybrid.placement import Placement, plan, profile_blocks
from lightning_hybrid.placement.micro_batches import choose_micro_batches, micro_batch_candidates
from lightning_hybrid.placement.problem import InfeasiblePlacementError, Problem, memory_table

log = logging.getLogger(__name__)
#: How a block is weighed: ``"auto"`` (timed where it can be, else FLOPs), ``"time"``, ``"flops"``.
BLOCK_COSTS = ("auto", "time", "flops")


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
    time_on: torch.device | str | None = None,
    reference_flops: float | None = None,
) -> Placement:
    """Place the blocks of ``container`` (its children, in order) in ``stages`` stages on ``devices``.

    ``example`` is one micro-batch (only its shape matters unless ``method="time"``, which times the real
    blocks and so needs them materialised); ``method`` a placement method's name, or the stage sizes in
    blocks; ``in_flight`` the micro-batches whose activations a stage holds at once; ``held_messages`` the
    copies of its input and output it keeps for its messages (:class:`~lightning_hybrid.placement.Problem`); ``checkpointed``
    whether the stages recompute their blocks' activations in backward (only the blocks' inputs held).
    ``options["block_cost"]`` weighs each block: ``"auto"`` (the default) and ``"time"`` by its measured time
    (timed here, as ``method="time"`` does, in FLOP-equivalents of the probed speed of ``time_on``, the device
    the rank trains on, so that the devices' speeds still divide it: blocks whose FLOPs run at different rates
    are placed by what they cost); a model on the meta device (``configure_model()``) is timed one block at a
    time on a copy made real (:func:`~lightning_hybrid.placement.cost.profile_blocks`); ``"flops"`` by its
    counted FLOPs. Where ``"auto"`` cannot time the blocks it counts FLOPs and says why
    (the placement's ``notes["block_cost"]`` says which was used). A placement that fits no device's memory is refused
    with the memory table of blocks and devices. With ``method="time"``, an ``example`` on the meta device (a
    shape given before any batch: ``input_shape``) is timed on values made for it. ``reference_flops``: the FLOP/s
    that turn measured seconds into FLOP-equivalents (probed on ``time_on`` when None; the placement's
    ``notes["reference_flops"]`` gives the value used, so that plans of one model at several micro-batch sizes
    share it).
    """
    named = list(container.named_children())
    options = dict(options)
    block_cost = options.pop("block_cost", "auto")
    if block_cost not in BLOCK_COSTS:
        raise ValueError(f"placement_options.block_cost must be one of {BLOCK_COSTS}, got {block_cost!r}")
    if block_cost == "auto":
        try:
            placement = plan_stages(container, example, devices, method, stages, objective, seed,
                                    {**options, "block_cost": "time"}, optimizer_slots, in_flight, checkpointed,
                                    held_messages, time_on, reference_flops)
        except InfeasiblePlacementError:
            raise
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as error:  # a block that cannot run apart
            log.info("placement: the blocks could not be timed (%s: %s); placed by their FLOPs", type(error).__name__, error)
            return plan_stages(container, example, devices, method, stages, objective, seed,
                               {**options, "block_cost": "flops"}, optimizer_slots, in_flight, checkpointed, held_messages)
        return placement
    timed = method == "time" or block_cost == "time"
    was_training = [block.training for _, block in named]
    # Profiling runs backward: the first batch may be validation's (sanity check), under inference mode.
    with torch.inference_mode(False), torch.enable_grad():
        on_meta = any(is_freed(block) for _, block in named)
        pairs = named if timed and not on_meta else [(name, meta_copy(block)) for name, block in named]
        micro_batch = len(example)
        if not timed or on_meta:  # shapes only (a model on the meta device is timed a block at a time, made real)
            # at least 2 samples (BatchNorm in training mode refuses one per channel), scaled back
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
                                in_flight=in_flight, checkpointed=checkpointed, batch_size=micro_batch,
                                time_on=time_on)
    for (_, block), training in zip(named, was_training):
        block.train(training)
    reference = None
    if block_cost == "time":  # seconds here x this device's FLOP/s: the units the devices' speeds divide
        reference = reference_flops or probe_speed(torch.device(time_on) if on_meta and time_on is not None else
                                                   torch.device("cpu") if on_meta else example.device)
        blocks = [dataclasses.replace(b, cost=b.time * reference) for b in blocks]
    devices = list(devices)
    try:
        if isinstance(method, str):
            placement = plan(blocks, devices, method=method, objective=objective, stages=stages, seed=seed,
                             held_messages=held_messages, **options)
            placement.notes.update(block_cost="time" if timed else "flops", reference_flops=reference)
            return placement
        edges = [0]
        for size in method:
            edges.append(edges[-1] + size)
        placement = Problem(blocks, devices, stages, held_messages).placement("given", list(range(stages)), list(zip(edges[:-1], edges[1:])))
    except InfeasiblePlacementError as error:
        raise InfeasiblePlacementError(f"{error}\n{memory_table(blocks, devices, stages)}") from None
    if not placement.feasible:
        raise InfeasiblePlacementError(f"the given stage sizes {list(method)} do not fit the devices' memory:\n"
                                       + memory_table(blocks, devices, stages, placement))
    placement.notes.update(block_cost="time" if timed else "flops", reference_flops=reference)
    return placement


def plan_pipeline(container: torch.nn.Module, batch: torch.Tensor, devices: Sequence[Device], method: str | Sequence[int],
                  stages: int, objective: str, seed: int, options: Mapping[str, Any], optimizer_slots: int, schedule: str,
                  micro_batches: int | None, checkpointed: bool = False,
                  time_on: torch.device | str | None = None) -> Placement:
    """:func:`plan_stages` on micro-batches of ``batch`` (a replica's batch, or its shape on the meta device) for
    ``micro_batches``, or for each count of :func:`micro_batch_candidates` (None, ``"auto"``), keeping the one of
    :func:`choose_micro_batches` (the placement's ``notes["micro_batches"]``). Every count's timings share one
    FLOP/s (the first plan's ``reference_flops``). A 1F1B stage holds at most ``stages`` micro-batches'
    activations at once, a GPipe stage all of them; each send's tensor is kept to the step's end."""
    reference: dict[str, float | None] = {"flops": None}

    def plan_for(count: int) -> Placement:
        size = max(len(batch) // micro_batch_count(len(batch), count), 1)
        placement = plan_stages(container, batch[:size], devices, method, stages, objective, seed, options,
                                optimizer_slots, in_flight=count if schedule == "GPipe" else min(count, stages),
                                checkpointed=checkpointed, held_messages=count, time_on=time_on,
                                reference_flops=reference["flops"])
        reference["flops"] = placement.notes.get("reference_flops")
        return placement

    counts = micro_batch_candidates(len(batch), stages) if micro_batches is None else [micro_batches]
    return choose_micro_batches(plan_for, counts)


def within_budgets(devices: Sequence[Device], budget: int | list[int] | None) -> list[Device]:
    """``devices`` with their memory capped at ``budget`` bytes (one for all, or one a device in order)."""
    if budget is None:
        return list(devices)
    limits = budget if isinstance(budget, list) else [budget] * len(devices)
    if len(limits) < len(devices):
        raise ValueError(f"memory_budget gives {len(limits)} sizes for {len(devices)} pipeline positions: give one "
                         "a rank of a replica, or one for all")
    return [dataclasses.replace(d, memory=min(d.memory, limit)) for d, limit in zip(devices, limits)]
