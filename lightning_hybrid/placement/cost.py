"""Cost model of a model's blocks: FLOPs, activation and memory sizes, and measured time."""

from __future__ import annotations

import time
from collections.abc import Iterable

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


def profile_blocks(
    model: nn.Module | Iterable[tuple[str, nn.Module]],
    example: torch.Tensor,
    optimizer_slots: int = 1,
    in_flight: int = 1,
    measure_time: bool = False,
    repeats: int = 3,
) -> list[Block]:
    """Measure each block on ``example`` (one batch, or one micro-batch) and return its :class:`Block`.

    ``cost`` is the FLOPs of the block's forward and backward (``torch.utils.flop_counter``);
    ``out_bytes`` the size of its output; ``memory`` the bytes of parameters, gradients and
    ``optimizer_slots`` optimizer states per parameter (1 for SGD with momentum, 2 for Adam), its
    buffers, plus the tensors autograd saves for backward (its own weights not counted twice) times
    ``in_flight`` micro-batches; ``workspace`` its largest parameter's bytes (a micro-batch's gradient
    computed apart before it is added); ``time`` (with
    ``measure_time``) the mean forward + backward seconds over ``repeats`` runs on this machine.
    The model's parameters, gradients and buffers (BatchNorm statistics) are left as they were.
    On the meta device (a model from ``configure_model()``, or
    :func:`~lightning_hybrid.pipeline.materialize.meta_copy`) everything but ``time`` is measured
    without memory.

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
    for index, (name, block) in enumerate(pairs):
        buffers = {key: value.clone() for key, value in block.state_dict().items()}
        grads = {p: p.grad for p in block.parameters()}
        own = {id(t) for t in [*block.parameters(), *block.buffers()]}
        saved = []

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            base = tensor._base if tensor._base is not None else tensor
            if id(tensor) not in own and id(base) not in own:  # the block's weights are counted once, below
                saved.append(tensor.numel() * tensor.element_size())
            return tensor

        inp = x.detach().requires_grad_(index > 0 and x.is_floating_point())
        with FlopCounterMode(display=False) as counter:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = block(inp)
            if out.requires_grad:
                out.backward(torch.ones_like(out))
        seconds = None
        if measure_time and example.is_meta:
            raise ValueError("measure_time needs real tensors, not the meta device: profile a materialised model")
        if measure_time:
            times = []
            for _ in range(repeats + 1):
                start = time.perf_counter()
                y = block(x.detach().requires_grad_(index > 0 and x.is_floating_point()))
                if y.requires_grad:
                    y.backward(torch.ones_like(y))
                times.append(time.perf_counter() - start)
            seconds = sum(times[1:]) / repeats
        param_bytes = sum(p.numel() * p.element_size() for p in block.parameters())
        buffer_bytes = sum(b.numel() * b.element_size() for b in block.buffers())
        result.append(
            Block(
                name=name,
                cost=float(counter.get_total_flops()),
                out_bytes=float(out.numel() * out.element_size()),
                memory=float(param_bytes * (2 + optimizer_slots) + buffer_bytes + sum(saved) * in_flight),
                params=sum(p.numel() for p in block.parameters()),
                time=seconds,
                workspace=float(max((p.numel() * p.element_size() for p in block.parameters()), default=0)),
            )
        )
        block.load_state_dict(buffers)
        for p, g in grads.items():
            p.grad = g
        x = out.detach()
    return result
