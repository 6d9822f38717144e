"""Cost model of a model's blocks: FLOPs, activation and memory sizes, and measured time."""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from lightning_hybrid.placement.problem import Block


def named_blocks(model: nn.Module | Iterable[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """``(name, block)`` pairs of an ``nn.Sequential`` (its children) or of an iterable of pairs."""
    if isinstance(model, nn.Sequential):
        return list(model.named_children())
    if isinstance(model, nn.Module):
        raise TypeError(
            f"{type(model).__name__} is not an nn.Sequential of blocks; pass the block sequence "
            "(see lightning_hybrid.pipeline: a module exposes it with pipeline_blocks())"
        )
    return list(model)


@dataclass(frozen=True)
class BlockTrace:
    """One block run forward and backward on an example: its FLOPs, the bytes autograd saved for its
    backward (each storage once, however many tensors or operations save it; its own weights not counted),
    of those the bytes of its input that the block before saved too (its output), its input's and output's
    bytes, and its tensors' bytes."""

    flops: float
    saved_bytes: float
    input_bytes: float
    out_bytes: float
    param_bytes: float
    largest_param_bytes: float
    buffer_bytes: float
    params: int
    saved_with_previous: float = 0.0

    def held_bytes(self, checkpointed: bool) -> float:
        """Bytes a micro-batch keeps alive between its forward and its backward: what autograd saved, or
        with activation checkpointing only the block's input (its activations recomputed in backward)."""
        return self.input_bytes if checkpointed else self.saved_bytes

    def shared_bytes(self, checkpointed: bool) -> float:
        """Of :meth:`held_bytes`, what the block before holds too (none checkpointed: a checkpointed block
        keeps its input, not its output)."""
        return 0.0 if checkpointed else self.saved_with_previous

    def recompute_bytes(self, checkpointed: bool) -> float:
        """Bytes alive at once only during this block's backward: its recomputed activations, checkpointed."""
        return self.saved_bytes if checkpointed else 0.0


def trace_blocks(model: nn.Module | Iterable[tuple[str, nn.Module]], example: torch.Tensor,
                 batch_size: int | None = None) -> list[tuple[str, BlockTrace]]:
    """Run each block of ``model`` forward and backward on ``example`` (on the meta device: shapes only) and
    measure it (:class:`BlockTrace`). ``batch_size``: the batch ``example`` stands for (activations and
    FLOPs scaled from ``len(example)``; a meta example of 2 samples stands for 1, as BatchNorm refuses
    one sample per channel). The blocks' parameters, gradients and buffers are left as they were."""
    scale = (batch_size / len(example)) if batch_size is not None else 1.0
    result = []
    x = example
    before: dict[int, int] = {}  # the storages the block before saved: their bytes
    for index, (name, block) in enumerate(named_blocks(model)):
        buffers = {key: value.clone() for key, value in block.state_dict().items()}
        grads = {p: p.grad for p in block.parameters()}
        own = {_storage(t) for t in [*block.parameters(), *block.buffers()]}
        saved: dict[int, int] = {}  # storage -> bytes: a tensor saved twice (a ReLU's result, a convolution's input) once

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            key = _storage(tensor)
            if key not in own:  # the block's weights are counted once, as parameters
                saved[key] = tensor.untyped_storage().nbytes()
            return tensor

        inp = x.detach().requires_grad_(index > 0 and x.is_floating_point())
        with FlopCounterMode(display=False) as counter:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = block(inp)
            if out.requires_grad:
                out.backward(torch.ones_like(out))
        param_sizes = [p.numel() * p.element_size() for p in block.parameters()]
        key = _storage(inp)  # the block before's output: saved by both?
        shared = saved.get(key, 0) if key in before else 0
        result.append((name, BlockTrace(
            flops=float(counter.get_total_flops()) * scale,
            saved_bytes=float(sum(saved.values())) * scale,
            input_bytes=float(inp.numel() * inp.element_size()) * scale,
            out_bytes=float(out.numel() * out.element_size()) * scale,
            param_bytes=float(sum(param_sizes)),
            largest_param_bytes=float(max(param_sizes, default=0)),
            buffer_bytes=float(sum(b.numel() * b.element_size() for b in block.buffers())),
            params=sum(p.numel() for p in block.parameters()),
            saved_with_previous=float(shared) * scale,
        )))
        block.load_state_dict(buffers)
        for p, g in grads.items():
            p.grad = g
        x, before = out.detach(), saved
    return result


def _on_meta(block: nn.Module) -> bool:
    return any(t.is_meta for t in itertools.chain(block.parameters(), block.buffers()))


def _time(block: nn.Module, x: torch.Tensor, repeats: int, first: bool) -> tuple[float, torch.Tensor]:
    """Mean forward + backward seconds of ``block`` on ``x`` over ``repeats`` runs (after one warm-up), and its
    output; its buffers (BatchNorm's statistics) and gradients left as they were."""
    buffers, grads = {k: v.clone() for k, v in block.state_dict().items()}, {p: p.grad for p in block.parameters()}
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        y = block(x.detach().requires_grad_(not first and x.is_floating_point()))
        if y.requires_grad:
            y.backward(torch.ones_like(y))
        times.append(time.perf_counter() - start)
    block.load_state_dict(buffers)
    for p, g in grads.items():
        p.grad = g
    return sum(times[1:]) / repeats, y.detach()


def _storage(tensor: torch.Tensor) -> int:
    """The identity of ``tensor``'s storage (shared by its views and detached copies; on the meta device too)."""
    return tensor.untyped_storage()._cdata


def materialised_for_timing(block: nn.Module, device: torch.device | str) -> nn.Module:
    """A copy of a block on the meta device with real tensors on ``device``: values for timing only (small
    random weights, BatchNorm's running variance 1), no ``reset_parameters()`` needed."""
    real = copy.deepcopy(block).to_empty(device=device)
    with torch.no_grad():
        for name, tensor in itertools.chain(real.named_parameters(), real.named_buffers()):
            if not tensor.is_floating_point():
                tensor.zero_()
            elif name.endswith("running_var"):
                tensor.fill_(1.0)
            else:
                tensor.normal_(0.0, 0.02)
    return real


def profile_blocks(
    model: nn.Module | Iterable[tuple[str, nn.Module]],
    example: torch.Tensor,
    optimizer_slots: int = 1,
    in_flight: int = 1,
    measure_time: bool = False,
    repeats: int = 3,
    checkpointed: bool = False,
    batch_size: int | None = None,
    time_on: torch.device | str | None = None,
) -> list[Block]:
    """Measure each block on ``example`` (one batch, or one micro-batch) and return its :class:`Block`.

    ``cost`` is the FLOPs of the block's forward and backward (``torch.utils.flop_counter``);
    ``out_bytes`` the size of its output; ``memory`` the bytes of parameters, gradients and
    ``optimizer_slots`` optimizer states per parameter (1 for SGD with momentum, 2 for Adam), its
    buffers, plus the tensors autograd saves for backward (its own weights not counted twice) times
    ``in_flight`` micro-batches (``checkpointed``: only each block's input, :mod:`lightning_hybrid.models.checkpointing`);
    ``workspace`` what it needs at once beside that: its largest parameter's bytes (a micro-batch's
    gradient computed apart before it is added), plus, checkpointed, its activations recomputed for
    its backward. ``batch_size``: the batch ``example`` stands for (:func:`trace_blocks`). ``time`` (with
    ``measure_time``) the mean forward + backward seconds over ``repeats`` runs on this machine.
    The model's parameters, gradients and buffers (BatchNorm statistics) are left as they were.
    On the meta device (a model from ``configure_model()``, or
    :func:`~lightning_hybrid.pipeline.materialize.meta_copy`) everything but ``time`` is measured
    without memory, and ``time`` on a copy of one block at a time made real on ``time_on`` (default: the
    CPU; :func:`materialised_for_timing`), fed random values of its input's shape: at most one block's
    memory at once, whatever the model's size.

    Example::

        >>> import torch
        >>> from lightning_hybrid.models import LeNet5
        >>> blocks = profile_blocks(LeNet5(), torch.zeros(8, 1, 28, 28))
        >>> [b.name for b in blocks][:3], blocks[0].out_bytes
        (['c1', 's2', 'c3'], 150528.0)
    """
    pairs = named_blocks(model)
    result = []
    x = example
    device = torch.device(time_on) if time_on is not None else torch.device("cpu")
    for (name, block), (_, trace) in zip(pairs, trace_blocks(pairs, example, batch_size)):
        seconds = None
        if measure_time:
            timed = materialised_for_timing(block, device) if _on_meta(block) else block
            if x.is_meta:  # a shape: random values of it, where the timed copy runs
                x = torch.randn(x.shape, device=device).to(x.dtype) if x.is_floating_point() \
                    else torch.zeros(x.shape, dtype=x.dtype, device=device)
            seconds, x = _time(timed, x, repeats, first=not result)
            del timed
        result.append(
            Block(
                name=name,
                cost=trace.flops,
                out_bytes=trace.out_bytes,
                memory=trace.param_bytes * (2 + optimizer_slots) + trace.buffer_bytes
                + trace.held_bytes(checkpointed) * in_flight,
                params=trace.params,
                time=seconds,
                workspace=trace.largest_param_bytes + trace.recompute_bytes(checkpointed),
                shared_with_previous=trace.shared_bytes(checkpointed) * in_flight,
            )
        )
    return result
