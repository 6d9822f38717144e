"""A rank adopting its pipeline stage once the placement is known: the stage's blocks materialised (a
model built on the meta device) or the other stages' freed (a model built whole), the optimizer state of
the freed parameters dropped, and what would be left on the meta device refused (plain torch).

:func:`adopt_stage` runs the steps in order; each is a function of its own (:func:`free_other_stages`,
:func:`drop_optimizer_state`, :func:`meta_outside_blocks`), used by
:class:`~lightning_hybrid.HybridParallelStrategy` when it adopts a placement.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

from lightning_hybrid.pipeline.materialize import check_ties, free, is_freed, materialize


def free_other_stages(blocks: Sequence[nn.Module], own: range) -> list[nn.Parameter]:
    """Free (:func:`~lightning_hybrid.pipeline.materialize.free`) every block outside ``own``; the
    parameters freed (the same objects, now on the meta device)."""
    others = [block for index, block in enumerate(blocks) if index not in own]
    freed = [param for block in others for param in block.parameters()]
    for block in others:
        free(block)
    return freed


def drop_optimizer_state(optimizers: Iterable[torch.optim.Optimizer], params: Iterable[torch.Tensor]) -> None:
    """Forget the state (momentum, moments) each optimizer holds for ``params``: state restored from a
    checkpoint before the placement, for parameters this rank no longer holds."""
    params = list(params)
    for optimizer in optimizers:
        for param in params:
            optimizer.state.pop(param, None)


def meta_outside_blocks(module: nn.Module, blocks: Iterable[nn.Module]) -> list[str]:
    """The names of ``module``'s parameters and buffers on the meta device that none of ``blocks`` holds
    (a model built in ``configure_model()`` with tensors outside its pipeline blocks: no stage
    materialises them)."""
    in_blocks = {id(t) for block in blocks for t in [*block.parameters(), *block.buffers()]}
    return [name for name, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta and id(t) not in in_blocks]


def adopt_stage(
    blocks: Sequence[nn.Module],
    names: Sequence[str],
    stages: Sequence[range],
    own: range,
    optimizers: Iterable[torch.optim.Optimizer] = (),
    states: dict[nn.Module, torch.Tensor] | None = None,
    init_weights: Callable[[nn.Module], None] | None = None,
) -> None:
    """Make ``blocks`` (named ``names``, cut into ``stages``) hold this rank's stage ``own`` only.

    Parameters tied across stages are refused (:func:`~lightning_hybrid.pipeline.materialize.check_ties`).
    A model on the meta device (any block freed) has ``own`` materialised on the CPU with the random
    ``states`` noted at its creation and its ``init_weights`` hook
    (:func:`~lightning_hybrid.pipeline.materialize.materialize`); a model built whole has the other
    stages' blocks freed, and ``optimizers`` (plain torch optimizers) forget their state. Works under
    ``torch.inference_mode`` too (the first batch may be a sanity check's)."""
    check_ties(blocks, stages, names)
    with torch.inference_mode(False):
        if any(is_freed(block) for block in blocks):
            materialize(blocks, own, "cpu", states, init_weights=init_weights)
        else:
            drop_optimizer_state(optimizers, free_other_stages(blocks, own))
