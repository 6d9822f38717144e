"""FullyShardedStrategy: fully sharded data parallelism (torch's ``fully_shard``, FSDP2) over the model's blocks, on
any device and backend (Lightning glue; the algorithm is :mod:`lightning_hybrid.comm.fsdp`).

Lightning's own ``FSDPStrategy`` and ``ModelParallelStrategy`` run on CUDA only; this one runs where the suite's
strategies do (CPU ranks over gloo, GPUs over NCCL), so that the pipeline can be measured against what a user with
a model too large for one device picks first, on the same machines.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.trainer.states import TrainerFn

from lightning_hybrid.comm import fsdp
from lightning_hybrid.pipeline.module_contract import found_sequential
from lightning_hybrid.strategies.checked_ddp import CheckedDDPStrategy
from lightning_hybrid.strategies.refusals import refuse_grad_scaler
from lightning_hybrid.strategies.replaced_step import unwrap_optimizer
from lightning_hybrid.strategies.even_batches import refuse_uneven_loaders
from lightning_hybrid.strategies.meeting import meeting


class FullyShardedStrategy(CheckedDDPStrategy):
    """Data parallelism whose ranks each hold a shard of the parameters, gradients and optimizer state.

    Every block of the module's block sequence (its ``pipeline_blocks()``, or the ``nn.Sequential`` holding all of
    its parameters, else its children) is an FSDP unit (:func:`lightning_hybrid.comm.fsdp.shard_blocks`): a rank
    keeps ``1/N`` of each parameter, all-gathers a block's parameters before it runs and reduce-scatters its
    gradient after its backward. The optimizer steps the shards. A step's result is DDP's: the gradient is the
    ranks' average, clipping (``gradient_clip_val``) takes the whole gradient's norm across the shards.

    Args:
        reshard_after_forward: ``True`` (ZeRO-3, FSDP's ``FULL_SHARD``): a block's parameters are freed after its
            forward and gathered again for its backward; ``False`` (ZeRO-2, ``SHARD_GRAD_OP``): they stay gathered
            from the forward until the backward, one all-gather a step instead of two, the whole model held
            while the step runs.
        process_group_backend, processes_per_device, fork_ranks: as every strategy of the suite.

    Activation checkpointing is the model's own (``model.checkpoint_blocks=true`` for the suite's networks).
    Every rank starts from rank 0's weights (broadcast before sharding); checkpoints hold the whole model and the
    optimizer's state over it (gathered to rank 0's CPU), and load into any strategy; loaders that give the ranks
    different numbers of batches are refused at each epoch's start.

    Examples:
        >>> import pytorch_lightning as pl
        >>> from lightning_hybrid import FullyShardedStrategy
        >>> strategy = FullyShardedStrategy(reshard_after_forward=False)
        >>> trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False)
        >>> trainer.strategy.reshard_after_forward
        False
        >>> # trainer.fit(model, datamodule=data)        or strategy="fsdp2" / "fsdp2_shard_grad_op"
    """

    wraps_model = False  # no DDP wrapper (CheckedDDPStrategy.wraps_model)

    strategy_name = "fsdp2"
    aliases = {
        "fsdp2": ("Fully sharded data parallelism (torch's fully_shard): parameters, gradients and optimizer state "
                  "sharded over the ranks (ZeRO-3)", {}),
        "fsdp2_shard_grad_op": ("Fully sharded data parallelism keeping a step's parameters gathered from its forward "
                                "to its backward (ZeRO-2)", {"reshard_after_forward": False}),
    }

    def __init__(self, reshard_after_forward: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(reshard_after_forward, bool):
            raise ValueError(f"reshard_after_forward must be True or False, got {reshard_after_forward!r}")
        self.reshard_after_forward = reshard_after_forward

    @property
    def memory_layout(self) -> dict:
        """Each rank holds a shard over every rank (:class:`~lightning_hybrid.callbacks.MemoryBudget` estimates so)."""
        return {"shards": self.num_processes * self.num_nodes, "reshard_after_forward": self.reshard_after_forward}

    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        refuse_grad_scaler("FullyShardedStrategy", self.precision_plugin)

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        model = super()._setup_model(model)  # rank 0's weights on every rank, before they are sharded
        blocks = found_sequential(model)
        fsdp.shard_blocks(model, list(blocks) if blocks is not None else list(model.children()),
                          fsdp.data_parallel_mesh(self.root_device.type), self.reshard_after_forward)
        return model

    def setup(self, trainer: pl.Trainer) -> None:
        if trainer.state.fn != TrainerFn.FITTING and _sharded(self.lightning_module):
            # validate/test/predict on the module a fit sharded: its shards hold one model, each block is gathered as it
            # runs (DDP's set-up would broadcast each rank's tensors, which a shard is not)
            self.accelerator.setup(trainer)
            self.setup_precision_plugin()
            meeting(trainer).attach().agree_by(self.stop_agreement(trainer))
            return
        super().setup(trainer)
        if trainer.state.fn == TrainerFn.FITTING:
            self.attach_sync_points(trainer)

    def on_epoch_start(self, trainer: pl.Trainer) -> None:
        refuse_uneven_loaders(type(self).__name__, trainer)  # a block's collectives in every batch

    # ------------------------------------------------------------------ checkpoints: the whole model
    def lightning_module_state_dict(self) -> dict[str, Any]:
        return fsdp.full_state_dict(self.lightning_module)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return fsdp.full_optimizer_state(self.lightning_module, unwrap_optimizer(optimizer))

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        """A checkpoint's whole model, into the module as it is: plain before the fit shards it, into the shards after
        (``trainer.test(ckpt_path=...)`` on the module a fit sharded)."""
        module = self.lightning_module
        if _sharded(module):
            fsdp.load_full_state_dict(module, checkpoint["state_dict"], strict=strict)
        else:
            super().load_model_state_dict(checkpoint, strict=strict)

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"]):
            fsdp.load_full_optimizer_state(self.lightning_module, unwrap_optimizer(optimizer), state)


def _sharded(module: torch.nn.Module) -> bool:
    """Whether ``module``'s parameters are shards (a fit by this strategy made them so)."""
    return any(type(p).__name__ == "DTensor" for p in module.parameters())
