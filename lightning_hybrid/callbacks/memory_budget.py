"""A memory budget a rank must train within, checked before training."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytorch_lightning as pl
import torch

from lightning_hybrid.data.shapes import batch_size_of, sample_shape
from lightning_hybrid.devices import parse_size
from lightning_hybrid.pipeline.module_contract import pipeline_blocks
from lightning_hybrid.placement.memory import MemoryBudgetExceeded, MiB, TrainingMemory, optimizer_slots, training_memory
from lightning_hybrid.strategies.capabilities import capabilities_of


class MemoryBudget(pl.Callback):
    """Each rank may hold ``limit`` (bytes, or a size such as ``"1GiB"``) to train. Where every rank holds
    the whole model (DDP and the suite's data-parallel strategies) or a shard of all of it (``strategy=fsdp2``),
    what one step needs (parameters, gradients, optimizer state, DDP's gradient buckets or the parameters a
    sharded rank gathers, one batch's activations, checkpointed or not:
    :func:`~lightning_hybrid.placement.memory.training_memory`, on the meta device) is checked before
    training and a run over the budget is refused, naming what it needs and how to need less. Where each
    rank holds part of the model (``strategy=hybrid``), the parts are placed within the budget instead.

    The batch is the datamodule's ``batch_size`` (one step's, per rank), a sample's shape its
    ``input_shape`` (or an ADNI view's volume); the model's blocks are its ``pipeline_blocks()``.

    ``limit`` may also be one size a rank (devices of unequal memory, ``memory_budget=[800MiB,2GiB]``): a rank that
    holds the whole model or an even shard of it must then fit the smallest; the pipeline places its stages
    within each rank's own.

    Example::

        >>> budget = MemoryBudget("1GiB")   # pl.Trainer(callbacks=[budget]); CLI: memory_budget=1GiB
        >>> budget.limit == 2**30, MemoryBudget(["1GiB", "2GiB"]).limit == 2**30
        (True, True)
    """

    def __init__(self, limit: float | str | Sequence[float | str]) -> None:
        many = isinstance(limit, Sequence) and not isinstance(limit, str)
        #: Each rank's budget, where they were given one a rank (None: the same for every rank).
        self.limits = [parse_size(v) for v in limit] if many else None
        self.limit = min(self.limits) if self.limits else parse_size(limit)
        if not self.limit > 0 or (self.limits is not None and not self.limits):
            raise ValueError(f"memory_budget must be a size above 0 (e.g. 1GiB), or one a rank, got {limit!r}")

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.check(trainer.strategy, pl_module, getattr(trainer, "datamodule", None))

    def check(self, strategy: Any, pl_module: pl.LightningModule, datamodule: Any) -> None:
        """Refuse (:class:`MemoryBudgetExceeded`) a run whose ranks hold the whole model and need more than the
        budget, or have ``strategy`` place its parts within it. The command calls it before any rank starts."""
        if capabilities_of(strategy).holds_part_of_the_model:
            capabilities_of(strategy).limit_memory(self.limits or self.limit)
            return
        need = self.estimate(pl_module, datamodule, **capabilities_of(strategy).memory_layout)
        if need is not None and need.total > self.limit:
            remedies = [*([] if need.checkpointed else ["activation checkpointing (model.checkpoint_blocks=true)"]),
                        *([] if need.batch_size == 1 else ["a smaller batch a step with gradient accumulation "
                                                           "(data.batch_size, trainer.accumulate_grad_batches)"]),
                        *([] if need.shards > 1 else ["the model's state sharded over the ranks (strategy=fsdp2)"]),
                        "a part of the model on each rank (strategy=hybrid)"]
            smallest = f" of its smallest rank ({self.limits.index(self.limit)})" if self.limits else ""
            raise MemoryBudgetExceeded(
                f"{type(strategy).__name__} needs about {need.total / MiB:.0f} MiB a rank to train "
                f"{type(getattr(pl_module, 'net', pl_module)).__name__} ({need.describe()}; MiB), over the memory "
                f"budget{smallest} of {self.limit / MiB:.0f} MiB (memory_budget). Need less with " + ", or ".join(remedies)
                + "; or raise memory_budget"
            )

    @staticmethod
    def estimate(pl_module: pl.LightningModule, datamodule: Any, **layout: Any) -> TrainingMemory | None:
        """What one rank needs (:class:`~lightning_hybrid.placement.memory.TrainingMemory`; ``layout``: how it holds
        the model, e.g. ``shards=2``), or None where the data does not say its batch or sample shape."""
        shape, batch = sample_shape(datamodule), batch_size_of(datamodule)
        if shape is None or batch is None:
            return None
        blocks = pipeline_blocks(pl_module)
        factory = getattr(pl_module, "optimizer_factory", None)  # ClassifierModule's: no scheduler built for this
        optimizer = (factory([torch.nn.Parameter(torch.zeros(1))]) if callable(factory)
                     else _first_optimizer(pl_module.configure_optimizers()))
        return training_memory(blocks, shape, batch, optimizer_slots(optimizer) if optimizer is not None else 2,
                               checkpointed=bool(getattr(blocks, "checkpoint_blocks", False)), **layout)


def _first_optimizer(configured: Any) -> torch.optim.Optimizer | None:
    """The (first) optimizer of what ``configure_optimizers()`` returned."""
    if isinstance(configured, torch.optim.Optimizer):
        return configured
    if isinstance(configured, dict):
        return _first_optimizer(configured.get("optimizer"))
    if isinstance(configured, (list, tuple)) and configured:
        return _first_optimizer(configured[0])
    return None
