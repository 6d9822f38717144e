"""A whole network's partition: the spatial plan of its convolutional part plus one plan per fully-connected layer.

The group owner (worker 0) runs the fully-connected layers; with ``fc_partition`` it shares each
one's weight matrix with the other workers (MoDNN: the owner is the group owner, the others are
the workers): ``"rows"`` is the 1-D baseline (contiguous blocks along the longer side, in
proportion to the workers' abilities), ``"mscc_fgcp"`` spectral co-clustering of the nonzero pattern
plus fine-grain cross partition of the outliers with the owner (:mod:`lightning_hybrid.partition.fgcp`).
A dense layer (fewer than ``min_sparsity`` zeros) has no co-cluster structure to find: it is split
by rows whichever method is asked for, and the plan says so.

Example::

    >>> from lightning_hybrid.models import LeNet5
    >>> plan = plan_partition(LeNet5().eval(), (1, 28, 28), [1.0, 2.0], fc_partition="rows")
    >>> sorted(plan.fc)                   # the fully-connected layers' step indices
    [9, 11]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from lightning_hybrid.partition.fc_cost import ABILITY_UNIT
from lightning_hybrid.partition.fc_partition import FCPartition, rows_partition
from lightning_hybrid.partition.fgcp import mscc_fgcp_partition
from lightning_hybrid.partition.spatial import NetworkPlan, PartitionError, plan_network

FC_PARTITIONS = ("mscc_fgcp", "rows", "owner")


@dataclass
class PartitionPlan:
    """The spatial plan and, per fully-connected step index, its weight partition among the workers."""

    spatial: NetworkPlan
    fc: dict[int, FCPartition] = field(default_factory=dict)
    fc_notes: dict[int, str] = field(default_factory=dict)

    @property
    def steps(self):
        return self.spatial.steps

    @property
    def workers(self) -> int:
        return self.spatial.workers


def plan_partition(
    net: nn.Module,
    sample_shape: Sequence[int],
    abilities: Sequence[float],
    conv_partition: str = "bodp",
    fc_partition: str = "mscc_fgcp",
    min_sparsity: float = 0.5,
    seed: int = 0,
    ability_unit: float = ABILITY_UNIT,
) -> PartitionPlan:
    """Plan ``net`` for ``len(abilities)`` workers (worker 0 is the group owner).

    The spatial split uses only the abilities' ratios. ``ability_unit`` is what an ability of 1
    means in multiply-accumulates per second for the FC cost model,
    :func:`lightning_hybrid.devices.macs_per_unit` of the abilities' unit: the default,
    :data:`~lightning_hybrid.partition.ABILITY_UNIT` (1e9), takes them as relative to a 1 GMAC/s
    device; ``macs_per_unit("flop/s")`` (0.5) takes them as FLOP/s, as
    :func:`~lightning_hybrid.devices.probe_speed` measures them."""
    if fc_partition not in FC_PARTITIONS:
        raise PartitionError(f"unknown fc_partition {fc_partition!r}; choose one of {FC_PARTITIONS}")
    spatial = plan_network(net, sample_shape, abilities, conv_partition)
    plan = PartitionPlan(spatial)
    if fc_partition == "owner" or spatial.workers < 2:
        return plan
    worker_abilities, go_ability = list(spatial.abilities[1:]), spatial.abilities[0]
    for index, step in enumerate(spatial.steps):
        if not (isinstance(step.module, nn.Linear) and step.kind == "owner" and len(step.in_shape) == 1):
            continue
        weight = step.module.weight.detach().cpu()
        sparsity = float((weight == 0).sum()) / weight.numel()
        method = fc_partition
        if method == "mscc_fgcp" and sparsity < min_sparsity:
            method = "rows"
            plan.fc_notes[index] = f"dense ({100 * sparsity:.0f}% zeros < {100 * min_sparsity:.0f}%): split by rows"
        if method == "rows":
            plan.fc[index] = rows_partition(weight.numpy(), worker_abilities, ability_unit=ability_unit)
        else:
            plan.fc[index] = mscc_fgcp_partition(weight.numpy(), worker_abilities, go_ability=go_ability, seed=seed,
                                                 ability_unit=ability_unit)
    return plan


def fc_weights(plan: FCPartition, linear: nn.Linear, party: int) -> torch.Tensor:
    """What ``party`` (a worker index, or the owner's ``GO``) multiplies with: its part's weights."""
    return plan.part_weights(linear.weight.detach().cpu().numpy(), party, dtype=linear.weight.dtype)
