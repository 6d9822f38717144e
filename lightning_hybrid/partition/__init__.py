"""Partitioning a network's work among heterogeneous devices for inference (paper 001, MoDNN).

No Lightning here: planners take a network or a layer and the devices' computing abilities and
return plans whose data movement (bytes per worker, peers, estimated compute and transfer time)
can be tabulated side by side with another plan's; the executor runs a plan over
``torch.distributed`` or simulates it in one process.

* :mod:`~lightning_hybrid.partition.spatial`: the convolutional part, split along the longest
  spatial axis in proportion to ability (BODP) or on an even 2-D grid, with halo exchange.
* :mod:`~lightning_hybrid.partition.network`: a whole network's plan (spatial part + one FC plan
  per fully-connected layer).
* :mod:`~lightning_hybrid.partition.spatial_executor`: running a plan (``DistributedExecutor``,
  ``simulate``) and its accounting (``plan_traffic``).

Sparse fully-connected layers:

* :mod:`~lightning_hybrid.partition.fc_cost`: the cost model (compute in dense MACs, transfer and
  wake-up time per worker) and the :class:`LayerCost` record.
* :mod:`~lightning_hybrid.partition.fc_partition`: a plan (:class:`FCPartition`) and the 1-D
  baseline :func:`rows_partition`.
* :mod:`~lightning_hybrid.partition.mscc`: spectral co-clustering (MSCC) of the nonzero pattern.
* :mod:`~lightning_hybrid.partition.fgcp`: :func:`mscc_fgcp_partition`, MoDNN's MSCC plus
  fine-grain cross partition (FGCP) of the outliers with the group owner.
* :mod:`~lightning_hybrid.partition.sparse`: canonical CSR input and the test matrices.
* :mod:`~lightning_hybrid.partition.proportional`: shares in proportion to ability (both kinds of
  layer).
* :mod:`~lightning_hybrid.partition.sparsity`: the measured sparsity above which SpMV beats GEMV.

Units of the abilities: :mod:`lightning_hybrid.devices`.

Example::

    >>> from lightning_hybrid.partition import block_sparse_matrix, mscc_fgcp_partition, rows_partition
    >>> W = block_sparse_matrix(400, 600, blocks=3, sparsity=0.9, outlier_fraction=0.1, seed=0)
    >>> base, plan = rows_partition(W, [1, 1, 2]), mscc_fgcp_partition(W, [1, 1, 2])
    >>> plan.cost("fc").reduction_vs(base.cost("fc")) > 0.3
    True
"""

from lightning_hybrid.partition.fc_cost import (
    ABILITY_UNIT,
    DEFAULT_THROUGHPUT,
    DEFAULT_WAKEUP_S,
    GO,
    LayerCost,
    compute_cost,
    compute_format,
    format_cost_table,
)
from lightning_hybrid.partition.fc_partition import FCPart, FCPartition, rows_partition
from lightning_hybrid.partition.fgcp import mscc_fgcp_partition
from lightning_hybrid.partition.mscc import spectral_coclusters
from lightning_hybrid.partition.network import PartitionPlan, plan_partition
from lightning_hybrid.partition.proportional import proportional_sizes
from lightning_hybrid.partition.sparse import block_sparse_matrix, random_sparse_matrix
from lightning_hybrid.partition.spatial import Box, NetworkPlan, PartitionError, plan_network
from lightning_hybrid.partition.sparsity import (
    PAPER_DENSITY_THRESHOLD,
    PAPER_SPARSITY_THRESHOLD,
    SparsityTimings,
    measure_sparsity_threshold,
    sparsity_timings,
    threshold_from_timings,
)

__all__ = [
    "ABILITY_UNIT", "DEFAULT_THROUGHPUT", "DEFAULT_WAKEUP_S", "GO", "PAPER_DENSITY_THRESHOLD",
    "PAPER_SPARSITY_THRESHOLD", "FCPart", "FCPartition", "LayerCost", "SparsityTimings",
    "block_sparse_matrix", "compute_cost", "compute_format", "format_cost_table",
    "measure_sparsity_threshold", "mscc_fgcp_partition", "proportional_sizes", "random_sparse_matrix",
    "rows_partition", "sparsity_timings", "spectral_coclusters", "threshold_from_timings",
    "Box", "NetworkPlan", "PartitionError", "PartitionPlan", "plan_network", "plan_partition",
]
