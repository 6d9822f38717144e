"""One rank's part of pipeline parallelism x data parallelism, in plain torch.distributed.

:class:`PipelineParallel` is what :class:`~lightning_hybrid.HybridParallelStrategy` drives (and
what a test drives without Lightning): given the model's blocks, the stages a placement cut them
into, the rank layout (:class:`~lightning_hybrid.pipeline.mesh.Mesh`) and the process groups, it
builds this rank's stage, runs training steps and forward passes through the pipeline with a
schedule (:mod:`~lightning_hybrid.pipeline.schedules`, run by
:class:`~lightning_hybrid.pipeline.stage_executor.StageExecutor`), shares the last stage's results with
the pipeline's ranks, and gathers the whole model (where every rank keeps it) and its gradient norm
from the stages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from lightning_hybrid.comm.collectives import all_reduce_, broadcast_, broadcast_object
from lightning_hybrid.pipeline.stage_executor import StageExecutor
from lightning_hybrid.pipeline.mesh import Mesh
from lightning_hybrid.pipeline.schedules import SCHEDULES, forward_only
from lightning_hybrid.pipeline.stage import StageModule


def micro_batch_count(batch_size: int, wanted: int) -> int:
    """The largest number of equal micro-batches, at most ``wanted``, that ``batch_size`` splits into."""
    return max(d for d in range(1, min(wanted, batch_size) + 1) if batch_size % d == 0)


class PipelineParallel:
    """Rank ``rank``'s stage of a pipeline replica.

    Args:
        blocks: the model's ``(name, block)`` sequence (the same block objects on every rank).
        stage_blocks: ``(start, stop)`` block ranges of the stages, in pipeline order.
        mesh: the stages x replicas layout, with the placement's device order.
        rank: this process's global rank.
        pipeline_group: the process group of this rank's replica (its collectives).
        device: this rank's device.
        slowdown: this stage's simulated compute slowdown (>= 1).
        message_group: the group of the same ranks the stages' messages travel in (``Mesh.groups``'s
            ``messages``); None: ``pipeline_group``.
        checkpointed: each block of the stage recomputes its activations in backward
            (:mod:`lightning_hybrid.models.checkpointing`; the network's ``checkpoint_blocks``).
    """

    def __init__(self, blocks: Sequence[tuple[str, nn.Module]], stage_blocks: Sequence[tuple[int, int]], mesh: Mesh,
                 rank: int, pipeline_group: dist.ProcessGroup | None, device: torch.device, slowdown: float = 1.0,
                 message_group: dist.ProcessGroup | None = None, checkpointed: bool = False) -> None:
        if len(stage_blocks) != mesh.stages:
            raise ValueError(f"{len(stage_blocks)} stage block ranges for a mesh of {mesh.stages} stages")
        self.blocks, self.stage_blocks, self.mesh = list(blocks), list(stage_blocks), mesh
        self.rank, self.group, self.device = rank, pipeline_group, device
        self.stage_index = mesh.stage_of(rank)
        start, stop = self.stage_blocks[self.stage_index]
        self.stage_module = StageModule(self.blocks, start, stop, slowdown=slowdown, checkpointed=checkpointed)
        self.replica = mesh.replica_of(rank)
        self.executor = StageExecutor(self.stage_module, self.stage_index, mesh.stage_ranks(self.replica),
                                      message_group if message_group is not None else pipeline_group, device)

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.mesh.stages - 1

    def _split(self, batch: torch.Tensor | None, micro_batches: int) -> list[torch.Tensor] | None:
        return None if batch is None else list(batch.chunk(micro_batches))

    def train_step(self, inputs: torch.Tensor, target: torch.Tensor, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                   schedule: str = "1F1B", micro_batches: int = 4, loss_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward and backward of one batch through the pipeline (every rank passes the whole
        batch; the first stage uses the inputs, the last the target). The stage's parameters
        accumulate the gradient of ``loss_scale`` x the mean micro-batch loss. Returns the mean loss
        and the whole batch's output, on every rank of the pipeline."""
        m = micro_batch_count(len(inputs), micro_batches)
        actions = SCHEDULES[schedule](self.stage_index, self.mesh.stages, m)
        try:
            losses, outputs = self.executor.train(
                actions, self._split(inputs, m), self._split(target, m), loss_fn, loss_scale / m,
            )
        except ValueError as err:  # BatchNorm's, on a micro-batch of one sample whose feature map is one voxel
            if "more than 1 value per channel" not in str(err) or len(inputs) // m > 1:
                raise
            raise ValueError(
                f"{err}: a batch of {len(inputs)} split into {m} micro-batches of 1 sample each reaches a BatchNorm "
                f"whose feature map is a single value per channel here. Split the batch into fewer micro-batches "
                f"(strategy.micro_batches={max(m // 2, 1)}) or raise the batch size (data.batch_size={2 * len(inputs)})"
            ) from err
        packed = None
        if self.is_last:
            loss = torch.stack(losses).mean()
            output = torch.cat(outputs)
            packed = torch.cat([loss.reshape(1).to(output.dtype), output.flatten()])
        packed = self.share_from_last_stage(packed)
        return packed[0].clone(), packed[1:].view(len(inputs), -1)

    def forward(self, inputs: torch.Tensor, micro_batches: int = 4) -> torch.Tensor:
        """The model's output for ``inputs`` through the pipeline, on every rank of the pipeline."""
        m = micro_batch_count(len(inputs), micro_batches)
        outputs = self.executor.forward(forward_only(self.stage_index, self.mesh.stages, m), self._split(inputs, m))
        return self.share_from_last_stage(torch.cat(outputs) if self.is_last else None)

    def share_from_last_stage(self, tensor: torch.Tensor | None) -> torch.Tensor:
        """Broadcast the last stage's tensor to its pipeline's ranks (the others pass None)."""
        src = self.mesh.stage_rank(self.replica, self.mesh.stages - 1)
        meta = None if tensor is None else (tuple(tensor.shape), tensor.dtype)
        shape, dtype = broadcast_object(meta, src=src, group=self.group)
        if tensor is None:
            tensor = torch.empty(shape, dtype=dtype, device=self.device)
        return broadcast_(tensor.detach().contiguous(), src=src, group=self.group)

    def gather_model(self) -> None:
        """Copy every stage's blocks (parameters and buffers) from the rank that trains them to the
        other ranks of its pipeline, so each rank holds the whole trained model."""
        for stage, (start, stop) in enumerate(self.stage_blocks):
            src = self.mesh.stage_rank(self.replica, stage)
            for _, block in self.blocks[start:stop]:
                for tensor in [*block.parameters(), *block.buffers()]:
                    broadcast_(tensor.data, src=src, group=self.group)

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Scale this stage's gradients so that the whole model's gradient norm (over the pipeline's
        stages) is at most ``max_norm``; return that norm."""
        params = [p for p in self.stage_module.parameters() if p.grad is not None]
        local = torch.zeros(1, device=self.device)
        for p in params:
            local += p.grad.detach().float().pow(2).sum()
        total = all_reduce_(local, group=self.group).sqrt().item()
        scale = float(max_norm) / (total + 1e-6)
        if scale < 1.0:
            for p in params:
                p.grad.detach().mul_(scale)
        return total
