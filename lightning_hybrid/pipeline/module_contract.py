"""What a LightningModule implements to be pipelined by :class:`~lightning_hybrid.HybridParallelStrategy`.

Two methods; a third and a fourth are optional::

    class MyModule(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(OrderedDict(conv=..., pool=..., head=...))

        def forward(self, x):
            return self.net(x)

        def pipeline_blocks(self) -> nn.Sequential:
            # the model as a sequence of blocks, each taking one tensor and returning one;
            # forward() must call it (validation, test and predict run through it)
            return self.net

        def pipeline_loss(self, output, target):
            # the loss of one micro-batch, a mean over its samples
            return F.cross_entropy(output, target)

        # optional: split a batch into (inputs, target); default: batch[0], batch[1]
        def pipeline_inputs(self, batch):
            return batch["image"], batch["label"]

        # optional: called on every rank after each training step with the whole batch's output
        # (gathered from the last stage), its target and mean loss, e.g. to log metrics
        def on_pipeline_step(self, output, target, loss):
            self.log("train/loss", loss)

``training_step`` is not called while pipelining: the strategy runs the blocks as a micro-batched
schedule, the loss is ``pipeline_loss`` averaged over micro-batches. ``validation_step``,
``test_step`` and ``predict_step`` are called as usual; inside them ``pipeline_blocks()`` computes
through the pipeline and returns the last stage's output on every rank.
:class:`~lightning_hybrid.ClassifierModule` implements all four for any ``nn.Sequential`` network
(LeNet-5, MLP, 3D-ResAttNet).

A plain LightningModule works without implementing this contract when its model is an ``nn.Sequential`` holding
all of its parameters (``self.model = nn.Sequential(...)``, called by ``forward``): that is its block
sequence (:func:`pipeline_blocks`); for training, its loss is an ``nn.Module`` attribute named
``loss_fn``, ``criterion`` or ``loss`` (:func:`pipeline_loss`). Inference (partitioned or through the
pipeline) never needs a loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


#: Attribute names under which a plain module's loss is found (an ``nn.Module`` such as ``nn.CrossEntropyLoss()``).
LOSS_ATTRIBUTES = ("loss_fn", "criterion", "loss")


def found_sequential(module: nn.Module) -> nn.Sequential | None:
    """The outermost non-empty ``nn.Sequential`` inside ``module`` that holds all of its parameters, if any."""
    params = {id(p) for p in module.parameters()}
    if not params:
        return None
    for _, sub in module.named_modules():
        if sub is not module and isinstance(sub, nn.Sequential) and len(sub) and {id(p) for p in sub.parameters()} == params:
            return sub
    return None


def pipeline_blocks(module: Any) -> nn.Sequential:
    """The module's block sequence: its ``pipeline_blocks()``, else the ``nn.Sequential`` found in it
    (:func:`found_sequential`), else a TypeError that says what to implement."""
    name = type(module).__name__
    if not callable(getattr(module, "pipeline_blocks", None)):
        found = found_sequential(module) if isinstance(module, nn.Module) else None
        if found is None:
            raise TypeError(
                f"{name} has no pipeline_blocks() and no nn.Sequential holding all of its parameters, so it cannot be "
                "split into blocks: implement pipeline_blocks() (returning the model as an nn.Sequential of blocks, "
                "called by forward), or keep the model in one nn.Sequential attribute; see "
                "lightning_hybrid.pipeline.module_contract"
            )
        return found
    blocks = module.pipeline_blocks()
    if not isinstance(blocks, nn.Sequential) or len(blocks) == 0:
        raise TypeError(f"{name}.pipeline_blocks() must return a non-empty nn.Sequential, got {type(blocks).__name__}")
    return blocks


def pipeline_loss(module: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss of one micro-batch for pipelined training: the module's ``pipeline_loss``, else an
    ``nn.Module`` attribute named as in :data:`LOSS_ATTRIBUTES`, else a TypeError saying what to add."""
    if callable(getattr(module, "pipeline_loss", None)):
        return module.pipeline_loss
    for attribute in LOSS_ATTRIBUTES:
        loss = getattr(module, attribute, None)
        if isinstance(loss, nn.Module):
            return loss
    raise TypeError(
        f"{type(module).__name__} needs a loss to be trained through a pipeline (its training_step is not called): "
        f"implement pipeline_loss(output, target) or set an nn.Module loss as self.{LOSS_ATTRIBUTES[0]} "
        "(e.g. nn.CrossEntropyLoss())"
    )


def pipeline_inputs(module: Any, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if callable(getattr(module, "pipeline_inputs", None)):
        return module.pipeline_inputs(batch)
    return batch[0], batch[1]
