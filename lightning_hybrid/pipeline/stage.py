"""A pipeline stage's module: a run of the model's blocks, optionally slowed to simulate a slower device."""

from __future__ import annotations

import time
from collections import OrderedDict

import torch
from torch import nn

from lightning_hybrid.models.checkpointing import run_blocks
from lightning_hybrid.sim.slowdown import stretch


class _Clock:
    def __init__(self) -> None:
        self.backward_start = 0.0
        self.slept = 0.0
        self.awaiting_first_parameter = False  # a first stage's backward ends at its first parameter's gradient


class _BackwardStarts(torch.autograd.Function):
    """Identity on the stage's output; its backward notes when the stage's backward starts."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, clock: _Clock) -> torch.Tensor:  # type: ignore[override]
        ctx.clock = clock
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        ctx.clock.backward_start = time.perf_counter()
        return grad, None


class _BackwardEnds(torch.autograd.Function):
    """Identity on the stage's input; its backward stretches the stage's backward by ``factor``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, clock: _Clock, factor: float) -> torch.Tensor:  # type: ignore[override]
        ctx.clock, ctx.factor = clock, factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        ctx.clock.slept += stretch(time.perf_counter() - ctx.clock.backward_start, ctx.factor)
        return grad, None, None


class StageModule(nn.Module):
    """Blocks ``start:stop`` of a block sequence, run in order (the same block objects: parameters are shared
    with the full model).

    ``slowdown > 1`` makes this stage's forward and backward last ``slowdown`` times as long as
    measured (a sleep after each), so that a CPU rank behaves like a slower device; time spent
    waiting for other stages is not stretched, as it is not inside the stage's computation. The first
    stage computes no gradient of its input for it (its backward's end is its first parameter's).
    ``checkpointed``: each block recomputes its activations in backward (:func:`run_blocks`).

    Example::

        >>> import torch
        >>> from lightning_hybrid.models import LeNet5
        >>> stage = StageModule(list(LeNet5().named_children()), 0, 2)
        >>> stage(torch.zeros(1, 1, 28, 28)).shape
        torch.Size([1, 6, 14, 14])
    """

    def __init__(self, blocks: list[tuple[str, nn.Module]], start: int, stop: int, slowdown: float = 1.0,
                 checkpointed: bool = False) -> None:
        super().__init__()
        if not 0 <= start < stop <= len(blocks):
            raise ValueError(f"stage blocks {start}:{stop} are not a non-empty run of the {len(blocks)} blocks")
        if not slowdown >= 1.0:
            raise ValueError(f"slowdown must be >= 1, got {slowdown}")
        self.blocks = nn.Sequential(OrderedDict(blocks[start:stop]))
        self.names = [name for name, _ in blocks[start:stop]]
        self.start, self.stop = start, stop
        self.slowdown = float(slowdown)
        self.checkpointed = checkpointed
        self._clock = _Clock()
        self._first = next(self.blocks.parameters(), None) if self.slowdown > 1.0 else None
        if self._first is not None:
            self._first.register_post_accumulate_grad_hook(self._first_parameter_done)

    def _first_parameter_done(self, _: torch.Tensor) -> None:
        """A first stage's backward ends where its first parameter's gradient is accumulated (its input
        needs none): stretch it there."""
        if self._clock.awaiting_first_parameter:
            self._clock.awaiting_first_parameter = False
            self._clock.slept += stretch(time.perf_counter() - self._clock.backward_start, self.slowdown)

    @property
    def slept_s(self) -> float:
        return self._clock.slept

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.slowdown == 1.0:
            return run_blocks(self.blocks, x, self.checkpointed)
        training = torch.is_grad_enabled()
        if training and x.is_floating_point():
            if not x.requires_grad and self._first is not None:
                # the first stage: no gradient of the input (a slowed stage would otherwise compute one that
                # no stage needs, the full-resolution stem's at that); backward ends at the first parameter
                self._clock.awaiting_first_parameter = True
            else:
                if not x.requires_grad:  # no parameters: give backward an end to time
                    x = x.detach().requires_grad_(True)
                x = _BackwardEnds.apply(x, self._clock, self.slowdown)
        start = time.perf_counter()
        out = run_blocks(self.blocks, x, self.checkpointed)
        self._clock.slept += stretch(time.perf_counter() - start, self.slowdown)
        if training and out.requires_grad:
            out = _BackwardStarts.apply(out, self._clock)
        return out
