"""Partitioning a sparse fully-connected layer ``y = W x`` among heterogeneous workers (MoDNN section 5).

A group owner (GO) holds the layer's input ``x`` and the workers hold parts of ``W`` (sent once, at
setup). Per inference the GO sends each worker the inputs ``x_j`` of every column ``j`` its part has
a nonzero in, the worker computes its partial outputs and returns a partial ``y_i`` for every row
``i`` its part has a nonzero in, and the GO sums the partials. The GO may keep part of ``W`` and
compute it itself, without any transfer. Every nonzero of ``W`` is computed by exactly one party.

A plan is an :class:`FCPartition`: the coordinates of ``W``'s nonzeros and, for each, its owner (a
worker index, or :data:`~lightning_hybrid.partition.fc_cost.GO`), with its estimated cost under the
model of :mod:`~lightning_hybrid.partition.fc_cost`. Two planners produce one:

* :func:`rows_partition` (here), the paper's 1-D baseline: contiguous blocks along ``W``'s longer
  side, sized in proportion to the workers' abilities;
* :func:`~lightning_hybrid.partition.fgcp.mscc_fgcp_partition`, the paper's MSCC + FGCP: spectral
  co-clustering of the nonzero pattern gives each worker one dense co-cluster, and the outliers
  (nonzeros outside the co-clusters) are shared between the workers and the GO by the fine-grain
  cross partition.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from lightning_hybrid.partition.fc_cost import (
    ABILITY_UNIT,
    DEFAULT_THROUGHPUT,
    DEFAULT_WAKEUP_S,
    GO,
    LayerCost,
    check_abilities,
    check_model,
    compute_cost,
    compute_format,
    compute_seconds,
    transfer_seconds,
)
from lightning_hybrid.partition.proportional import proportional_sizes
from lightning_hybrid.partition.sparse import distinct_indices, nonzero_coords, to_csr
from lightning_hybrid.partition.sparsity import PAPER_SPARSITY_THRESHOLD

# --------------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FCPart:
    """One party's share of ``W``: the nonzeros it computes, the inputs it needs and the outputs it returns.

    Args:
        owner: the worker index, or :data:`GO`.
        rows, cols: coordinates in ``W`` of the part's nonzeros (row-major order).
        index: positions of these nonzeros in the plan's (row-major) list of ``W``'s nonzeros.
    """

    owner: int
    rows: np.ndarray
    cols: np.ndarray
    index: np.ndarray

    @cached_property
    def out_rows(self) -> np.ndarray:
        """The rows the part has a nonzero in: the partial outputs a worker returns."""
        return distinct_indices(self.rows)

    @cached_property
    def in_cols(self) -> np.ndarray:
        """The columns the part has a nonzero in: the inputs a worker receives."""
        return distinct_indices(self.cols)

    @property
    def nnz(self) -> int:
        return int(self.rows.size)

    @property
    def density(self) -> float:
        """Nonzeros over the area of the part's ``out_rows x in_cols`` sub-block (0 if empty)."""
        area = self.out_rows.size * self.in_cols.size
        return self.nnz / area if area else 0.0

    def format(self, sparsity_threshold: float = PAPER_SPARSITY_THRESHOLD) -> str:
        """``"spmv"``, ``"gemv"`` or ``"none"`` (empty), see :func:`compute_format`."""
        return compute_format(self.nnz, self.out_rows.size, self.in_cols.size, sparsity_threshold)

    def compute(self, sparsity_threshold: float = PAPER_SPARSITY_THRESHOLD) -> float:
        """Dense-MAC cost, see :func:`compute_cost`."""
        return compute_cost(self.nnz, self.out_rows.size, self.in_cols.size, sparsity_threshold)

    def elements_sent(self) -> int:
        """Input plus output elements exchanged with the GO per inference (0 for the GO's own part)."""
        return 0 if self.owner == GO else int(self.out_rows.size + self.in_cols.size)

    def weights(self, values: np.ndarray, fmt: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The part's weights as the party would store them: a CSR tensor (``"spmv"``) or a dense
        ``len(out_rows) x len(in_cols)`` tensor (``"gemv"``), from the plan-ordered nonzero ``values``."""
        local_rows = np.searchsorted(self.out_rows, self.rows)
        local_cols = np.searchsorted(self.in_cols, self.cols)
        shape = (self.out_rows.size, self.in_cols.size)
        vals = torch.as_tensor(np.asarray(values)[self.index]).to(dtype)
        if fmt == "spmv":
            indptr = np.zeros(shape[0] + 1, dtype=np.int64)
            np.cumsum(np.bincount(local_rows, minlength=shape[0]), out=indptr[1:])
            # rows and cols are in row-major order, so the column indices are already sorted per row
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*(Sparse CSR tensor support|Sparse invariant checks).*")
                return torch.sparse_csr_tensor(
                    torch.as_tensor(indptr), torch.as_tensor(local_cols.astype(np.int64)), vals, size=shape
                )
        block = torch.zeros(shape, dtype=dtype)
        block[torch.as_tensor(local_rows), torch.as_tensor(local_cols)] = vals
        return block


@dataclass
class FCPartition:
    """A plan for ``y = W x``: who computes each nonzero of ``W``.

    Args:
        shape: ``(r, c)`` of ``W``.
        rows, cols: coordinates of ``W``'s nonzeros in row-major order.
        owner: for each nonzero, the worker index (``0 .. k-1``) or :data:`GO`.
        abilities: the workers' computing abilities (see :mod:`~lightning_hybrid.partition.fc_cost`).
        method: the planner's name.
        go_ability, throughput, wakeup_s, sparsity_threshold, element_size, ability_unit: the cost
            model (see :mod:`~lightning_hybrid.partition.fc_cost`); ``sparsity_threshold`` is a
            fraction of zeros, ``ability * ability_unit`` a party's MAC/s.
        info: what the planner wants to report (clusters, outliers, FGCP moves, timings).

    Example::

        >>> from lightning_hybrid.partition import block_sparse_matrix
        >>> W = block_sparse_matrix(60, 90, blocks=2, sparsity=0.8, outlier_fraction=0.1, seed=0)
        >>> plan = rows_partition(W, [1.0, 2.0])
        >>> plan.peers, plan.total_bytes() > 0
        (((-1,), (-1,)), True)
        >>> x = torch.randn(90)
        >>> torch.allclose(plan.apply(W, x), torch.as_tensor(W) @ x, atol=1e-5)
        True
    """

    shape: tuple[int, int]
    rows: np.ndarray
    cols: np.ndarray
    owner: np.ndarray
    abilities: tuple[float, ...]
    method: str
    go_ability: float = 1.0
    throughput: float = DEFAULT_THROUGHPUT
    wakeup_s: float = DEFAULT_WAKEUP_S
    sparsity_threshold: float = PAPER_SPARSITY_THRESHOLD
    element_size: int = 4
    ability_unit: float = ABILITY_UNIT
    info: dict = field(default_factory=dict)

    @property
    def workers(self) -> int:
        return len(self.abilities)

    @property
    def nnz(self) -> int:
        return int(self.rows.size)

    @cached_property
    def _parts(self) -> tuple[FCPart, ...]:
        owners = [*range(self.workers), GO]
        return tuple(
            FCPart(o, self.rows[idx], self.cols[idx], idx) for o in owners for idx in [np.flatnonzero(self.owner == o)]
        )

    def part(self, worker: int) -> FCPart:
        """Worker ``worker``'s part, or the GO's with :data:`GO`."""
        if worker == GO:
            return self._parts[-1]
        if not 0 <= worker < self.workers:
            raise IndexError(f"worker {worker} out of range for {self.workers} workers")
        return self._parts[worker]

    @property
    def parts(self) -> tuple[FCPart, ...]:
        """The workers' parts, in worker order (``parts[i].owner == i``); the GO's is :attr:`go_part`."""
        return self._parts[:-1]

    @property
    def all_parts(self) -> tuple[FCPart, ...]:
        """The workers' parts in order, then the GO's: every nonzero of ``W`` is in exactly one."""
        return self._parts

    @property
    def go_part(self) -> FCPart:
        return self._parts[-1]

    @property
    def peers(self) -> tuple[tuple[int, ...], ...]:
        """Each worker's communication partners: only the GO (none for a worker with an empty part)."""
        return tuple((GO,) if self.part(i).nnz else () for i in range(self.workers))

    def bytes_sent(self, element_size: int | None = None) -> list[int]:
        """Bytes each worker exchanges with the GO per inference: inputs received plus partial outputs returned."""
        size = self.element_size if element_size is None else element_size
        return [self.part(i).elements_sent() * size for i in range(self.workers)]

    def total_bytes(self, element_size: int | None = None) -> int:
        """Transmission size per inference: the sum of :meth:`bytes_sent` over the workers."""
        return int(sum(self.bytes_sent(element_size)))

    def formats(self) -> list[str]:
        """Each part's compute format (workers, then the GO): ``"spmv"``, ``"gemv"`` or ``"none"``."""
        return [p.format(self.sparsity_threshold) for p in self.all_parts]

    def compute_s(self) -> list[float]:
        """Each worker's estimated compute seconds."""
        return [
            compute_seconds(self.part(i).compute(self.sparsity_threshold), self.abilities[i], self.ability_unit)
            for i in range(self.workers)
        ]

    def go_compute_s(self) -> float:
        return compute_seconds(self.go_part.compute(self.sparsity_threshold), self.go_ability, self.ability_unit)

    def transfer_s(self) -> list[float]:
        """Each worker's estimated data-delivery seconds: bytes / throughput + one wake-up (0 if idle)."""
        return [transfer_seconds(b, self.throughput, self.wakeup_s) for b in self.bytes_sent()]

    def estimated_s(self) -> list[float]:
        """``ET[i]`` of each worker: compute plus transfer seconds."""
        return [c + t for c, t in zip(self.compute_s(), self.transfer_s())]

    def cost(self, layer: str = "fc") -> LayerCost:
        """This plan's :class:`LayerCost` record, for side-by-side tables."""
        return LayerCost(
            layer=layer, method=self.method, bytes_per_worker=tuple(self.bytes_sent()), peers=self.peers,
            compute_s=tuple(self.compute_s()), transfer_s=tuple(self.transfer_s()), go_compute_s=self.go_compute_s(),
        )

    def _values(self, W) -> np.ndarray:
        csr = to_csr(W)
        if csr.shape != tuple(self.shape):
            raise ValueError(f"W has shape {csr.shape}, the plan was made for {tuple(self.shape)}")
        rows, cols = nonzero_coords(csr)
        if rows.size != self.rows.size or not (np.array_equal(rows, self.rows) and np.array_equal(cols, self.cols)):
            raise ValueError(
                f"W's nonzero pattern ({rows.size} nonzeros) is not the one the plan was made for "
                f"({self.rows.size}); partition the new pattern again"
            )
        return csr.data

    def part_weights(self, W, worker: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weights ``worker`` (or :data:`GO`) stores for its part, in its compute format: a CSR
        tensor or a dense block of shape ``(len(part.out_rows), len(part.in_cols))``."""
        p = self.part(worker)
        return p.weights(self._values(W), p.format(self.sparsity_threshold), dtype)

    def apply(self, W, x) -> torch.Tensor:
        """``y = W x`` computed part by part, as the distributed execution would.

        For each part: gather the inputs it needs (``x[in_cols]``, what the GO sends), multiply by
        the part's weights in its format (CSR for SpMV, a dense block for GEMV), and add the partial
        outputs into ``y[out_rows]`` (what the GO sums). ``x`` is ``(c,)`` or ``(c, batch)``
        (columns are samples; pass ``x.T`` for ``nn.Linear``'s ``(batch, c)``). ``W`` (numpy,
        scipy sparse or a dense or sparse torch tensor) must have the nonzero pattern the plan was
        made for; its values may differ.

        Example::

            >>> from lightning_hybrid.partition import mscc_fgcp_partition, random_sparse_matrix
            >>> W = random_sparse_matrix(30, 40, sparsity=0.7, seed=1)
            >>> plan = mscc_fgcp_partition(W, [1.0, 1.0])
            >>> x = torch.randn(40, 3)
            >>> torch.allclose(plan.apply(W, x), torch.as_tensor(W) @ x, atol=1e-5)
            True
        """
        x = torch.as_tensor(x)
        if x.dim() not in (1, 2) or x.shape[0] != self.shape[1]:
            raise ValueError(f"x must have shape ({self.shape[1]},) or ({self.shape[1]}, batch), got {tuple(x.shape)}")
        dtype = x.dtype if x.is_floating_point() else torch.float32
        x = x.to(dtype)
        values = self._values(W)
        y = torch.zeros((self.shape[0], *x.shape[1:]), dtype=dtype)
        for p in self.all_parts:
            if not p.nnz:
                continue
            weights = p.weights(values, p.format(self.sparsity_threshold), dtype)
            sent = x[torch.as_tensor(p.in_cols)]
            y.index_add_(0, torch.as_tensor(p.out_rows), weights @ sent)
        return y

    def summary(self) -> str:
        """One line per party: nonzeros, rows x cols, density, format, bytes, ET."""
        lines = [f"{self.method}: W {self.shape[0]}x{self.shape[1]}, {self.nnz} nonzeros, {self.workers} workers"]
        et, sent = self.estimated_s(), self.bytes_sent()
        for i in range(self.workers):
            p = self.part(i)
            lines.append(
                f"  worker {i} (ability {self.abilities[i]:g}): {p.nnz} nz in {p.out_rows.size}x{p.in_cols.size} "
                f"(density {p.density:.3f}, {p.format(self.sparsity_threshold)}), {sent[i]} B, ET {1e3 * et[i]:.2f} ms"
            )
        g = self.go_part
        lines.append(
            f"  GO (ability {self.go_ability:g}): {g.nnz} nz in {g.out_rows.size}x{g.in_cols.size}, "
            f"ET {1e3 * self.go_compute_s():.2f} ms"
        )
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Baseline: 1-D partition along the longer side
# --------------------------------------------------------------------------------------------------


def rows_partition(
    W,
    abilities: Sequence[float],
    *,
    workers: int | None = None,
    along: str = "longer",
    go_ability: float = 0.0,
    throughput: float = DEFAULT_THROUGHPUT,
    wakeup_s: float = DEFAULT_WAKEUP_S,
    sparsity_threshold: float = PAPER_SPARSITY_THRESHOLD,
    element_size: int = 4,
    ability_unit: float = ABILITY_UNIT,
) -> FCPartition:
    """MoDNN's baseline (section 7.3): cut ``W`` along its longer side into contiguous, non-overlapping
    blocks whose sizes are proportional to ``abilities``; the GO computes nothing.

    "Along its longer side" is read as: the longer dimension is cut into pieces (as BODP cuts a
    feature map's longer edge), so a wide ``W`` (``c > r``, VGG-16's fc6 and fc8) is cut into column
    blocks (each worker needs its columns' inputs and returns a partial output for every row they
    touch: about ``c + k*r`` elements in all) and a tall or square one into row blocks (each worker
    returns its rows' outputs and needs every input they touch: about ``k*c + r``). This is the
    cheaper of the two 1-D cuts. ``along="shorter"`` takes the other reading (method
    ``"rows/shorter"``); ``"rows"`` and ``"cols"`` force a direction.

    ``workers``, if given, must equal ``len(abilities)``. With ``go_ability > 0`` (not in the paper;
    method suffix ``"+go"``) the GO keeps the last block, sized in proportion to its ability like
    the workers' blocks, which shows how much of MSCC+FGCP's saving comes from the GO computing at
    all. The cost-model arguments only matter for the plan's estimated times (see
    :mod:`~lightning_hybrid.partition.fc_cost`).

    Example::

        >>> W = np.ones((4, 10), dtype=np.float32)
        >>> plan = rows_partition(W, [1.0, 4.0])  # 10 columns > 4 rows: columns are cut, 2 and 8
        >>> [p.in_cols.size for p in plan.parts[:2]], plan.bytes_sent()
        ([2, 8], [24, 48])
        >>> rows_partition(W, [1.0, 1.0], along="shorter").bytes_sent()  # rows 2 + 2, all 10 inputs each
        [48, 48]
    """
    csr = to_csr(W)
    values = check_abilities(abilities, workers)
    check_model(go_ability, throughput, wakeup_s, sparsity_threshold, element_size)
    if along not in ("longer", "shorter", "rows", "cols"):
        raise ValueError(f"along must be 'longer', 'shorter', 'rows' or 'cols', got {along!r}")
    r, c = csr.shape
    longer_is_rows = r >= c
    along_rows = {"longer": longer_is_rows, "shorter": not longer_is_rows, "rows": True, "cols": False}[along]
    n = r if along_rows else c
    if n < len(values):
        raise ValueError(f"cannot cut {n} {'rows' if along_rows else 'columns'} among {len(values)} workers")
    sizes = proportional_sizes(n, [*values, go_ability] if go_ability > 0 else values)
    bounds = np.cumsum(sizes)
    rows, cols = nonzero_coords(csr)
    owner = np.searchsorted(bounds, rows if along_rows else cols, side="right").astype(np.int64)
    owner[owner == len(values)] = GO
    method = "rows" if along_rows == longer_is_rows else "rows/shorter"
    return FCPartition(
        shape=(r, c), rows=rows, cols=cols, owner=owner, abilities=values,
        method=method + ("+go" if go_ability > 0 else ""), go_ability=go_ability,
        throughput=throughput, wakeup_s=wakeup_s, sparsity_threshold=sparsity_threshold,
        element_size=element_size, ability_unit=ability_unit,
        info={"along": "rows" if along_rows else "cols", "sizes": sizes},
    )
