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
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def pipeline_blocks(module: Any) -> nn.Sequential:
    """The module's block sequence, or a TypeError that says what to implement."""
    name = type(module).__name__
    if not callable(getattr(module, "pipeline_blocks", None)) or not callable(getattr(module, "pipeline_loss", None)):
        raise TypeError(
            f"{name} cannot be pipelined: implement pipeline_blocks() (returning the model as an nn.Sequential of "
            "blocks) and pipeline_loss(output, target); see lightning_hybrid.pipeline.protocol for an example"
        )
    blocks = module.pipeline_blocks()
    if not isinstance(blocks, nn.Sequential) or len(blocks) == 0:
        raise TypeError(f"{name}.pipeline_blocks() must return a non-empty nn.Sequential, got {type(blocks).__name__}")
    return blocks


def pipeline_inputs(module: Any, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if callable(getattr(module, "pipeline_inputs", None)):
        return module.pipeline_inputs(batch)
    return batch[0], batch[1]
