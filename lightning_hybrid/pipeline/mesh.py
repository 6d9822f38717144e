"""The pipeline x data-parallel layout of ranks: which rank runs which stage of which replica.

The two parallel dimensions as one small, explicit object (as torchtitan's ``ParallelDims``): the
sizes, the order of the placement's devices along the pipeline, every rank's coordinates, and the
process groups of each dimension.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch.distributed as dist


class MeshGroups(NamedTuple):
    """One rank's process groups: its replica's ranks for collectives (``pipeline``) and, apart, for
    the stages' messages (``messages``: activations and gradients, point to point; torch's collective
    check counts a group's messages in its sequence numbers, and the stages of a pipeline send
    different numbers of them, so a group that carries both looks desynchronised), and the ranks at
    its position in every replica (``data_parallel``)."""

    pipeline: dist.ProcessGroup
    messages: dist.ProcessGroup
    data_parallel: dist.ProcessGroup


@dataclass(frozen=True)
class Mesh:
    """``stages`` pipeline positions times ``replicas`` data-parallel copies of the pipeline.

    Rank ``r`` is position ``r % stages`` of replica ``r // stages``. Position ``p`` is device ``p``
    of the placement; ``order[s]`` is the position that runs stage ``s`` (the placement's device
    order), so the ranks of one replica are consecutive and the data-parallel peers of a rank are
    the ranks at its position in the other replicas.

    Example::

        >>> mesh = Mesh(stages=2, replicas=2, order=(1, 0))
        >>> mesh.pipeline_ranks(1), mesh.data_parallel_ranks(0), mesh.stage_of(2), mesh.stage_rank(1, 0)
        ([2, 3], [0, 2], 1, 3)
    """

    stages: int
    replicas: int
    order: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.stages < 1 or self.replicas < 1:
            raise ValueError(f"stages and replicas must be >= 1, got {self.stages} and {self.replicas}")
        order = tuple(self.order) or tuple(range(self.stages))
        if sorted(order) != list(range(self.stages)):
            raise ValueError(f"order must be a permutation of 0..{self.stages - 1}, got {list(order)}")
        object.__setattr__(self, "order", order)

    @property
    def world_size(self) -> int:
        return self.stages * self.replicas

    def replica_of(self, rank: int) -> int:
        return rank // self.stages

    def position_of(self, rank: int) -> int:
        return rank % self.stages

    def stage_of(self, rank: int) -> int:
        return self.order.index(self.position_of(rank))

    def stage_rank(self, replica: int, stage: int) -> int:
        """Global rank running ``stage`` in ``replica``."""
        return replica * self.stages + self.order[stage]

    def pipeline_ranks(self, replica: int) -> list[int]:
        return list(range(replica * self.stages, (replica + 1) * self.stages))

    def data_parallel_ranks(self, position: int) -> list[int]:
        return [replica * self.stages + position for replica in range(self.replicas)]

    def groups(self, rank: int, backend: str | None = None) -> MeshGroups:
        """``rank``'s groups (:class:`MeshGroups`). Every rank must call this, in the same order: it
        creates all the groups of both dimensions."""
        pipeline = messages = data_parallel = None
        for replica in range(self.replicas):
            ranks = self.pipeline_ranks(replica)
            collectives, p2p = dist.new_group(ranks, backend=backend), dist.new_group(ranks, backend=backend)
            if replica == self.replica_of(rank):
                pipeline, messages = collectives, p2p
        for position in range(self.stages):
            group = dist.new_group(self.data_parallel_ranks(position), backend=backend)
            if position == self.position_of(rank):
                data_parallel = group
        return MeshGroups(pipeline, messages, data_parallel)

    def stage_ranks(self, replica: int) -> list[int]:
        """The global rank running each stage of ``replica``, in stage order."""
        return [self.stage_rank(replica, stage) for stage in range(self.stages)]

    @staticmethod
    def check(stages: int, replicas: int, world_size: int) -> None:
        if stages * replicas != world_size:
            raise ValueError(
                f"pipeline_stages={stages} x data_parallel={replicas} = {stages * replicas} processes, but the Trainer "
                f"runs {world_size} (devices x num_nodes); set trainer.devices={stages * replicas} or change "
                "pipeline_stages / data_parallel"
            )


