"""Partitioning a sparse fully-connected layer ``y = W x`` among heterogeneous workers (MoDNN section 5).

A group owner (GO) holds the layer's input ``x`` and the workers hold parts of ``W`` (sent once, at
setup). Per inference the GO sends each worker the inputs ``x_j`` of every column ``j`` its part has
a nonzero in, the worker computes its partial outputs and returns a partial ``y_i`` for every row
``i`` its part has a nonzero in, and the GO sums the partials. The GO may keep part of ``W`` and
compute it itself, without any transfer. Every nonzero of ``W`` is computed by exactly one party.

A plan is an :class:`FCPartition`: the coordinates of ``W``'s nonzeros and, for each, its owner (a
worker index, or :data:`GO`). Two planners produce one:

* :func:`rows_partition`, the paper's 1-D baseline: contiguous blocks along ``W``'s longer side,
  sized in proportion to the workers' abilities;
* :func:`mscc_fgcp_partition`, the paper's MSCC + FGCP: spectral co-clustering of the nonzero
  pattern gives each worker one dense co-cluster, and the outliers (nonzeros outside the
  co-clusters) are shared between the workers and the GO by the fine-grain cross partition.

Cost model (the paper gives the terms, not the units; these are ours):

* compute, in *dense multiply-accumulates* (MACs): a part with ``nnz`` nonzeros spanning
  ``n_rows`` rows and ``n_cols`` columns is computed with SpMV when its density
  ``nnz / (n_rows * n_cols)`` is below the density threshold ``d* = 1 - sparsity_threshold``, else
  with GEMV on its ``n_rows x n_cols`` sub-block. GEMV costs ``n_rows * n_cols`` MACs and SpMV
  ``nnz / d*`` (the threshold is where the two take equal time, so SpMV's cost per nonzero is
  ``1 / d*`` dense MACs: 6.3 with the paper's 15.8%). Hence ``compute = min(nnz / d*, n_rows * n_cols)``
  (:func:`compute_cost`), linear in the work as the paper measured (section 7.1);
* abilities (``CA[i]``) are in units of ``ability_unit`` dense MACs per second (default 1e9: an
  ability of 1.0 is 1 GMAC/s); compute time = compute / (ability * ability_unit);
* transfer time of a worker = (inputs received + partial outputs sent) * ``element_size`` /
  ``throughput`` + ``wakeup_s`` (one wake-up per worker per layer, nothing for an idle worker);
  defaults are the paper's WLAN measurements, 43.8 Mbit/s and 54.7 ms (section 7.1);
* ``ET[i]`` = compute time + transfer time; the GO's ``ET_GO`` = its compute time (its sending
  and summing are not modelled, as in the paper).
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import scipy.sparse as sp
import torch

from lightning_hybrid.partition.sparsity import PAPER_SPARSITY_THRESHOLD

log = logging.getLogger(__name__)

GO = -1
"""The group owner's index in owners and peer lists (workers are ``0 .. k-1``)."""

DEFAULT_THROUGHPUT = 43.8e6 / 8
"""Bytes per second: MoDNN's measured WLAN throughput, 43.8 Mbit/s (section 7.1)."""

DEFAULT_WAKEUP_S = 54.7e-3
"""Seconds: MoDNN's measured WLAN wake-up time (section 7.1)."""

ABILITY_UNIT = 1e9
"""Dense multiply-accumulates per second per unit of ability (an ability of 1.0 is 1 GMAC/s)."""


# --------------------------------------------------------------------------------------------------
# Accounting shared by the layer partitions (FC here; conv partitions can produce the same record)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerCost:
    """What one partitioned layer costs per inference, per worker.

    Args:
        layer: the layer's name (``"fc6"``).
        method: the partition scheme (``"rows"``, ``"mscc+fgcp"``, ``"bodp"``, ``"grid"``...).
        bytes_per_worker: bytes each worker exchanges per inference (received plus sent).
        peers: for each worker, the parties it exchanges data with (:data:`GO` or worker indices).
        compute_s: each worker's estimated compute seconds.
        transfer_s: each worker's estimated data-delivery seconds (transmission plus wake-up).
        go_compute_s: the GO's estimated compute seconds for the part it keeps.

    Example::

        >>> c = LayerCost("fc8", "rows", (400, 600), ((GO,), (GO,)), (0.01, 0.02), (0.06, 0.06))
        >>> c.total_bytes, c.max_peers, round(c.makespan_s, 3)
        (1000, 1, 0.08)
    """

    layer: str
    method: str
    bytes_per_worker: tuple[int, ...]
    peers: tuple[tuple[int, ...], ...]
    compute_s: tuple[float, ...]
    transfer_s: tuple[float, ...]
    go_compute_s: float = 0.0

    @property
    def workers(self) -> int:
        return len(self.bytes_per_worker)

    @property
    def total_bytes(self) -> int:
        return int(sum(self.bytes_per_worker))

    @property
    def max_peers(self) -> int:
        return max((len(p) for p in self.peers), default=0)

    @property
    def estimated_s(self) -> tuple[float, ...]:
        """Each worker's estimated time ``ET[i]`` (compute plus transfer)."""
        return tuple(c + t for c, t in zip(self.compute_s, self.transfer_s))

    @property
    def makespan_s(self) -> float:
        """The layer's estimated time: the slowest worker, or the GO if it is slower."""
        return max(max(self.estimated_s, default=0.0), self.go_compute_s)

    def reduction_vs(self, baseline: LayerCost) -> float:
        """Fraction of ``baseline``'s total bytes this plan saves (negative if it sends more)."""
        return 1.0 - self.total_bytes / baseline.total_bytes if baseline.total_bytes else 0.0

    def as_dict(self) -> dict:
        return {
            "layer": self.layer, "method": self.method, "workers": self.workers,
            "total_bytes": self.total_bytes, "bytes_per_worker": list(self.bytes_per_worker),
            "peers": [list(p) for p in self.peers], "max_peers": self.max_peers,
            "compute_s": list(self.compute_s), "transfer_s": list(self.transfer_s),
            "go_compute_s": self.go_compute_s, "makespan_s": self.makespan_s,
        }


def format_cost_table(costs: Sequence[LayerCost], baseline_method: str | None = None) -> str:
    """A markdown table of layer costs, one row each; with ``baseline_method``, each row's byte
    reduction against the row of that method for the same layer and worker count.

    Example::

        >>> a = LayerCost("fc8", "rows", (600, 600), ((GO,), (GO,)), (0.0, 0.0), (0.1, 0.1))
        >>> b = LayerCost("fc8", "mscc+fgcp", (300, 300), ((GO,), (GO,)), (0.0, 0.0), (0.1, 0.1))
        >>> print(format_cost_table([a, b], baseline_method="rows").splitlines()[-1])
        | fc8 | mscc+fgcp | 2 | 600 | 300 / 300 | 1 | 100.0 | 0.0 | 50.0% |
    """
    header = "| layer | method | workers | total bytes | bytes per worker | max peers | est. ms | GO ms |"
    rule = "|---|---|---|---|---|---|---|---|"
    if baseline_method:
        header += f" reduction vs {baseline_method} |"
        rule += "---|"
    base = {(c.layer, c.workers): c for c in costs if c.method == baseline_method}
    lines = [header, rule]
    for c in costs:
        line = (
            f"| {c.layer} | {c.method} | {c.workers} | {c.total_bytes} | "
            f"{' / '.join(str(b) for b in c.bytes_per_worker)} | {c.max_peers} | "
            f"{1e3 * c.makespan_s:.1f} | {1e3 * c.go_compute_s:.1f} |"
        )
        if baseline_method:
            ref = base.get((c.layer, c.workers))
            line += f" {100 * c.reduction_vs(ref):.1f}% |" if ref else " |"
        lines.append(line)
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Cost model
# --------------------------------------------------------------------------------------------------


def compute_cost(nnz: int, n_rows: int, n_cols: int, sparsity_threshold: float = PAPER_SPARSITY_THRESHOLD) -> float:
    """Dense-MAC cost of a part: ``min(nnz / d*, n_rows * n_cols)`` with ``d* = 1 - sparsity_threshold``.

    The first term is SpMV (used when the part is sparser than the threshold), the second GEMV.

    Example::

        >>> compute_cost(100, 10, 100, sparsity_threshold=0.75)  # density 0.1 < 0.25: SpMV, 4 MACs/nonzero
        400.0
        >>> compute_cost(600, 10, 100, sparsity_threshold=0.75)  # density 0.6: GEMV on the 10 x 100 block
        1000.0
    """
    if nnz <= 0:
        return 0.0
    dense = float(n_rows) * float(n_cols)
    density_threshold = 1.0 - sparsity_threshold
    if density_threshold <= 0.0:
        return dense
    return min(nnz / density_threshold, dense)


def compute_format(nnz: int, n_rows: int, n_cols: int, sparsity_threshold: float = PAPER_SPARSITY_THRESHOLD) -> str:
    """``"spmv"`` if the part is sparser than ``sparsity_threshold`` (fraction of zeros), else ``"gemv"``
    (``"none"`` for an empty part).

    Example::

        >>> compute_format(100, 10, 100, 0.842), compute_format(600, 10, 100, 0.842)
        ('spmv', 'gemv')
    """
    if nnz <= 0:
        return "none"
    return "spmv" if nnz < (1.0 - sparsity_threshold) * float(n_rows) * float(n_cols) else "gemv"


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
        return _distinct(self.rows)

    @cached_property
    def in_cols(self) -> np.ndarray:
        """The columns the part has a nonzero in: the inputs a worker receives."""
        return _distinct(self.cols)

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
        abilities: the workers' computing abilities (see the module's cost model).
        method: the planner's name.
        go_ability, throughput, wakeup_s, sparsity_threshold, element_size, ability_unit: the cost
            model (see the module docstring); ``sparsity_threshold`` is a fraction of zeros.
        info: what the planner wants to report (clusters, outliers, FGCP moves, timings).

    Example::

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
            self.part(i).compute(self.sparsity_threshold) / (self.abilities[i] * self.ability_unit)
            for i in range(self.workers)
        ]

    def go_compute_s(self) -> float:
        cost = self.go_part.compute(self.sparsity_threshold)
        if cost == 0:
            return 0.0
        return cost / (self.go_ability * self.ability_unit) if self.go_ability > 0 else math.inf

    def transfer_s(self) -> list[float]:
        """Each worker's estimated data-delivery seconds: bytes / throughput + one wake-up (0 if idle)."""
        return [b / self.throughput + (self.wakeup_s if b else 0.0) for b in self.bytes_sent()]

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
        csr = _to_csr(W)
        if csr.shape != tuple(self.shape):
            raise ValueError(f"W has shape {csr.shape}, the plan was made for {tuple(self.shape)}")
        rows, cols = _nonzero(csr)
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
# Input handling
# --------------------------------------------------------------------------------------------------


def _to_csr(W) -> sp.csr_matrix:
    """Any 2-D matrix (numpy, scipy sparse, dense or sparse torch tensor) as a canonical scipy CSR."""
    if isinstance(W, torch.Tensor):
        if W.dim() != 2:
            raise ValueError(f"W must be a 2-D matrix (r outputs x c inputs), got shape {tuple(W.shape)}")
        W = W.detach().cpu()
        if W.layout != torch.strided:
            coo = W.to_sparse_coo().coalesce()
            idx = coo.indices().numpy()
            W = sp.coo_matrix((coo.values().numpy(), (idx[0], idx[1])), shape=tuple(W.shape))
        else:
            W = W.numpy()
    if sp.issparse(W):
        if W.ndim != 2:
            raise ValueError(f"W must be a 2-D matrix, got shape {W.shape}")
        csr = sp.csr_matrix(W, copy=True)
    else:
        arr = np.asarray(W)
        if arr.ndim != 2:
            raise ValueError(f"W must be a 2-D matrix (r outputs x c inputs), got shape {arr.shape}")
        csr = sp.csr_matrix(arr)
    csr.sum_duplicates()
    csr.eliminate_zeros()
    csr.sort_indices()
    return csr


def _distinct(index: np.ndarray) -> np.ndarray:
    """``np.unique`` of non-negative integers in O(n + max) instead of a sort."""
    if not index.size:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.bincount(index))


def _nonzero(csr: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """Row-major coordinates of a canonical CSR's entries (int64)."""
    rows = np.repeat(np.arange(csr.shape[0], dtype=np.int64), np.diff(csr.indptr))
    return rows, csr.indices.astype(np.int64)


def _check_abilities(abilities: Sequence[float], workers: int | None) -> tuple[float, ...]:
    try:
        values = tuple(float(a) for a in abilities)
    except TypeError as err:
        raise ValueError(f"abilities must be a sequence of positive numbers, got {abilities!r}") from err
    if not values:
        raise ValueError("abilities is empty: give one computing ability per worker")
    if workers is not None and len(values) != workers:
        raise ValueError(f"got {len(values)} abilities for {workers} workers: give exactly one per worker")
    bad = [a for a in values if not (a > 0 and math.isfinite(a))]
    if bad:
        raise ValueError(f"abilities must be positive and finite, got {list(values)}")
    return values


def _check_model(go_ability: float, throughput: float, wakeup_s: float, sparsity_threshold: float, element_size: int) -> None:
    if not (go_ability >= 0 and math.isfinite(go_ability)):
        raise ValueError(f"go_ability must be >= 0 (0: the GO computes nothing), got {go_ability}")
    if not (throughput > 0):
        raise ValueError(f"throughput must be positive (bytes/s), got {throughput}")
    if not (wakeup_s >= 0):
        raise ValueError(f"wakeup_s must be >= 0, got {wakeup_s}")
    if not (0.0 <= sparsity_threshold <= 1.0):
        raise ValueError(f"sparsity_threshold is a fraction of zeros in [0, 1], got {sparsity_threshold}")
    if element_size < 1:
        raise ValueError(f"element_size must be a positive number of bytes, got {element_size}")


def proportional_sizes(n: int, abilities: Sequence[float]) -> list[int]:
    """Split ``n`` items into ``len(abilities)`` integer sizes proportional to ``abilities``
    (largest remainder; ties go to the earlier worker).

    Example::

        >>> proportional_sizes(10, [1, 2, 2])
        [2, 4, 4]
    """
    total = float(sum(abilities))
    exact = [n * a / total for a in abilities]
    sizes = [math.floor(e) for e in exact]
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - sizes[i]), i))
    for i in order[: n - sum(sizes)]:
        sizes[i] += 1
    return sizes


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
    all. The cost-model arguments only matter for the plan's estimated times (see the module
    docstring).

    Example::

        >>> W = np.ones((4, 10), dtype=np.float32)
        >>> plan = rows_partition(W, [1.0, 4.0])  # 10 columns > 4 rows: columns are cut, 2 and 8
        >>> [p.in_cols.size for p in plan.parts[:2]], plan.bytes_sent()
        ([2, 8], [24, 48])
        >>> rows_partition(W, [1.0, 1.0], along="shorter").bytes_sent()  # rows 2 + 2, all 10 inputs each
        [48, 48]
    """
    csr = _to_csr(W)
    values = _check_abilities(abilities, workers)
    _check_model(go_ability, throughput, wakeup_s, sparsity_threshold, element_size)
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
    rows, cols = _nonzero(csr)
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


# --------------------------------------------------------------------------------------------------
# MSCC: spectral co-clustering of the nonzero pattern
# --------------------------------------------------------------------------------------------------


def _majority(labels_of_other: np.ndarray, index: np.ndarray, other: np.ndarray, n: int, k: int) -> np.ndarray:
    """For each of ``n`` items, the most common label among its nonzeros' partners (-1 if none labelled)."""
    known = labels_of_other[other] >= 0
    votes = np.bincount(index[known] * k + labels_of_other[other[known]], minlength=n * k).reshape(n, k)
    best = votes.argmax(axis=1)
    best[votes.max(axis=1) == 0] = -1
    return best


def spectral_coclusters(
    rows: np.ndarray,
    cols: np.ndarray,
    shape: tuple[int, int],
    n_clusters: int,
    *,
    seed: int = 0,
    max_cluster_nnz: int | None = None,
    svd_method: str = "randomized",
) -> tuple[np.ndarray, np.ndarray]:
    """Row and column labels (``0 .. n_clusters-1``; -1 for empty rows and columns) of the binary pattern.

    Runs scikit-learn's ``SpectralCoclustering`` (Dhillon's bipartite spectral co-clustering, the
    "MSCC" of MoDNN) on the scipy-sparse 0/1 pattern restricted to its nonempty rows and columns (the
    algorithm normalises by row and column sums and cannot take empty ones). With
    ``max_cluster_nnz``, a pattern with more nonzeros is clustered on a uniform random sample of that
    many of them (a coarser pattern of the same structure); rows and columns the sample misses then
    take the label most common among the columns (rows) of their nonzeros.

    Example::

        >>> W = block_sparse_matrix(40, 60, blocks=2, sparsity=0.6, outlier_fraction=0.0, seed=0)
        >>> r, c = np.nonzero(W)
        >>> row_labels, col_labels = spectral_coclusters(r, c, W.shape, 2)
        >>> sorted(np.bincount(row_labels).tolist())
        [20, 20]
    """
    from sklearn.cluster import SpectralCoclustering

    n_rows, n_cols = shape
    row_labels = np.full(n_rows, -1, dtype=np.int64)
    col_labels = np.full(n_cols, -1, dtype=np.int64)
    active_rows, active_cols = _distinct(rows), _distinct(cols)
    if active_rows.size < n_clusters or active_cols.size < n_clusters:
        raise ValueError(
            f"W has {active_rows.size} nonempty rows and {active_cols.size} nonempty columns: too few for "
            f"{n_clusters} co-clusters (one per worker); use fewer workers"
        )
    if n_clusters == 1:
        row_labels[active_rows] = 0
        col_labels[active_cols] = 0
        return row_labels, col_labels
    rng = np.random.default_rng(seed)
    sr, sc = rows, cols
    if max_cluster_nnz is not None and rows.size > max_cluster_nnz:
        keep = rng.random(rows.size) < max_cluster_nnz / rows.size
        sr, sc = rows[keep], cols[keep]
    ur, uc = _distinct(sr), _distinct(sc)
    row_pos, col_pos = np.zeros(n_rows, dtype=np.int64), np.zeros(n_cols, dtype=np.int64)
    row_pos[ur], col_pos[uc] = np.arange(ur.size), np.arange(uc.size)
    pattern = sp.csr_matrix((np.ones(sr.size, dtype=np.float64), (row_pos[sr], col_pos[sc])), shape=(ur.size, uc.size))
    model = SpectralCoclustering(n_clusters=n_clusters, svd_method=svd_method, random_state=seed)
    model.fit(pattern)
    row_labels[ur] = model.row_labels_
    col_labels[uc] = model.column_labels_
    for _ in range(3):  # rows and columns the sample missed vote with their nonzeros' partners
        missing_rows = np.setdiff1d(active_rows, np.flatnonzero(row_labels >= 0))
        missing_cols = np.setdiff1d(active_cols, np.flatnonzero(col_labels >= 0))
        if not missing_rows.size and not missing_cols.size:
            break
        if missing_rows.size:
            vote = _majority(col_labels, rows, cols, n_rows, n_clusters)
            row_labels[missing_rows] = vote[missing_rows]
        if missing_cols.size:
            vote = _majority(row_labels, cols, rows, n_cols, n_clusters)
            col_labels[missing_cols] = vote[missing_cols]
    row_labels[active_rows] = np.maximum(row_labels[active_rows], 0)
    col_labels[active_cols] = np.maximum(col_labels[active_cols], 0)
    return row_labels, col_labels


# --------------------------------------------------------------------------------------------------
# FGCP: fine-grain cross partition of the outliers
# --------------------------------------------------------------------------------------------------


class _Loads:
    """Incremental per-party nonzero, row and column counts, for cheap ET updates during FGCP."""

    def __init__(self, rows, cols, owner, shape, k, model: dict) -> None:
        self.r, self.c, self.k = shape[0], shape[1], k
        slot = np.where(owner == GO, k, owner)  # GO is slot k
        self.row_count = np.bincount(slot * self.r + rows, minlength=(k + 1) * self.r).reshape(k + 1, self.r)
        self.col_count = np.bincount(slot * self.c + cols, minlength=(k + 1) * self.c).reshape(k + 1, self.c)
        self.nnz = np.bincount(slot, minlength=k + 1)
        self.n_rows = np.count_nonzero(self.row_count, axis=1)
        self.n_cols = np.count_nonzero(self.col_count, axis=1)
        self.model = model

    def et(self, slot: int, nnz: int, n_rows: int, n_cols: int) -> float:
        m = self.model
        cost = compute_cost(nnz, n_rows, n_cols, m["sparsity_threshold"])
        if slot == self.k:
            if cost == 0:
                return 0.0
            return cost / (m["go_ability"] * m["ability_unit"]) if m["go_ability"] > 0 else math.inf
        if nnz == 0:
            return 0.0
        sent = (n_rows + n_cols) * m["element_size"]
        return cost / (m["abilities"][slot] * m["ability_unit"]) + sent / m["throughput"] + m["wakeup_s"]

    def all_et(self) -> np.ndarray:
        return np.array([self.et(s, self.nnz[s], self.n_rows[s], self.n_cols[s]) for s in range(self.k + 1)])

    def after_move(self, src: int, dst: int, g_rows: np.ndarray, g_cols: np.ndarray):
        """ETs of ``src`` and ``dst`` if the nonzeros at ``(g_rows, g_cols)`` moved from one to the other."""
        ur, nr = np.unique(g_rows, return_counts=True)
        uc, nc = np.unique(g_cols, return_counts=True)
        lost_rows = int(np.count_nonzero(self.row_count[src, ur] == nr))
        lost_cols = int(np.count_nonzero(self.col_count[src, uc] == nc))
        new_rows = int(np.count_nonzero(self.row_count[dst, ur] == 0))
        new_cols = int(np.count_nonzero(self.col_count[dst, uc] == 0))
        n = g_rows.size
        src_et = self.et(src, self.nnz[src] - n, self.n_rows[src] - lost_rows, self.n_cols[src] - lost_cols)
        dst_et = self.et(dst, self.nnz[dst] + n, self.n_rows[dst] + new_rows, self.n_cols[dst] + new_cols)
        return src_et, dst_et

    def move(self, src: int, dst: int, g_rows: np.ndarray, g_cols: np.ndarray) -> None:
        np.subtract.at(self.row_count[src], g_rows, 1)
        np.subtract.at(self.col_count[src], g_cols, 1)
        np.add.at(self.row_count[dst], g_rows, 1)
        np.add.at(self.col_count[dst], g_cols, 1)
        n = g_rows.size
        self.nnz[src] -= n
        self.nnz[dst] += n
        for s in (src, dst):
            self.n_rows[s] = np.count_nonzero(self.row_count[s])
            self.n_cols[s] = np.count_nonzero(self.col_count[s])


def _fgcp(rows, cols, owner, outlier, rule: str, shape, k: int, model: dict) -> dict:
    """FGCP's offloading loop, in place on ``owner``; returns what it did.

    Outliers of worker ``i`` are grouped by column (row rule) or by row (column rule). Repeatedly:
    take the worker with the largest ``ET``, tentatively move its smallest remaining outlier group
    to the GO, and keep the move if the plan's makespan ``max(max_i ET[i], ET_GO)`` does not rise
    (it falls, or stays level because another worker ties at the maximum; the moved-from worker's
    own ET always falls, as it drops at least one input or output). Stop at the first rejected move
    or when the slowest worker has no outliers left.
    """
    loads = _Loads(rows, cols, owner, shape, k, model)
    idx = np.flatnonzero(outlier)
    keys = owner[idx] * (shape[1] if rule == "row" else shape[0]) + (cols[idx] if rule == "row" else rows[idx])
    order = np.argsort(keys, kind="stable")
    idx, keys = idx[order], keys[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if idx.size else np.array([], dtype=np.int64)
    ends = np.r_[starts[1:], idx.size].astype(np.int64)
    group_owner = owner[idx[starts]] if idx.size else np.array([], dtype=np.int64)
    sizes = ends - starts
    queues = []
    for w in range(k):
        mine = np.flatnonzero(group_owner == w)
        queues.append(list(mine[np.argsort(sizes[mine], kind="stable")][::-1]))  # pop() yields the smallest
    et = loads.all_et()
    before = float(et.max())
    moves = moved = 0
    while True:
        objective = float(et.max())
        w = int(np.argmax(et[:k]))
        if not queues[w]:
            break
        g = queues[w][-1]
        members = idx[starts[g]:ends[g]]
        src_et, go_et = loads.after_move(w, k, rows[members], cols[members])
        trial = et.copy()
        trial[w], trial[k] = src_et, go_et
        if not (trial.max() <= objective * (1 + 1e-12) and src_et < et[w]):
            break
        queues[w].pop()
        loads.move(w, k, rows[members], cols[members])
        owner[members] = GO
        et = trial
        moves += 1
        moved += members.size
    return {
        "rule": rule, "outlier_groups": int(starts.size), "moves": moves, "offloaded_nnz": int(moved),
        "makespan_before_s": before, "makespan_after_s": float(et.max()),
    }


def mscc_fgcp_partition(
    W,
    abilities: Sequence[float],
    go_ability: float = 1.0,
    throughput: float = DEFAULT_THROUGHPUT,
    wakeup_s: float = DEFAULT_WAKEUP_S,
    seed: int = 0,
    *,
    workers: int | None = None,
    sparsity_threshold: float = PAPER_SPARSITY_THRESHOLD,
    element_size: int = 4,
    ability_unit: float = ABILITY_UNIT,
    outlier_rule: str = "auto",
    fgcp: bool = True,
    max_cluster_nnz: int | None = None,
    svd_method: str = "randomized",
) -> FCPartition:
    """MoDNN's MSCC + FGCP (sections 5.2-5.3): one dense co-cluster per worker, outliers balanced with the GO.

    1. **MSCC.** The 0/1 pattern of ``W`` (empty rows and columns left out) is co-clustered into
       ``k = len(abilities)`` co-clusters (:func:`spectral_coclusters`). The nonzeros whose row and
       column fall in the same co-cluster belong to it; all others are *outliers*.
    2. **Initial outlier assignment.** If the outlier matrix has fewer nonempty columns than rows
       (``outlier_rule="row"``), an outlier goes with the co-cluster holding its row (the worker
       then needs one more input per outlier column and returns nothing extra); otherwise
       (``"col"``, the paper's transposed case) with the co-cluster holding its column. ``"auto"``
       applies that paper rule; ``"best"`` runs FGCP with both and keeps the plan with the lower
       makespan, then the fewer bytes.
    3. **Co-clusters to workers.** Co-clusters are ranked by estimated compute (co-cluster plus its
       initial outliers) and given to the workers ranked by ability: the biggest to the most able.
    4. **FGCP** (if ``fgcp``). Repeatedly take the worker with the largest ``ET[i]`` and offload to
       the GO its outliers in the one column (row rule; one row for the column rule) with the fewest
       nonzeros, as long as that does not raise ``max(max_i ET[i], ET_GO)`` (ties at the maximum
       are let through so tied workers can all be relieved; the paper says "balance" without a
       stopping rule). It stops at the first move that would raise it, or when the slowest worker
       has no outliers left. ``go_ability=0`` keeps everything on the workers.

    Abilities and ``go_ability`` are in GMAC/s by default; units and the ET formula are in the
    module docstring. What to expect (``benchmarks/fc_transfer.py``): scattered outliers touch
    almost every row (column), so MSCC alone saves little; the saving comes from FGCP moving the
    outliers to the GO, down to about ``r + c`` elements in all, and so depends on how fast the GO
    is relative to the wake-up and transfer time it saves. ``max_cluster_nnz`` clusters a sample of
    the pattern (for very large layers; VGG-16's fc6 at 70% sparsity, 31 M nonzeros, clusters in
    about 5 s on 2 cores without it; a dense layer has r*c nonzeros and may want it). ``plan.info`` records the co-cluster sizes, the outliers,
    FGCP's moves and the clustering time.

    Example::

        >>> W = block_sparse_matrix(120, 180, blocks=3, sparsity=0.9, outlier_fraction=0.1, seed=0)
        >>> plan = mscc_fgcp_partition(W, [1.0, 1.0, 2.0], go_ability=2.0)
        >>> plan.total_bytes() < rows_partition(W, [1.0, 1.0, 2.0]).total_bytes()
        True
    """
    csr = _to_csr(W)
    values = _check_abilities(abilities, workers)
    _check_model(go_ability, throughput, wakeup_s, sparsity_threshold, element_size)
    if outlier_rule not in ("auto", "row", "col", "best"):
        raise ValueError(f"outlier_rule must be 'auto', 'row', 'col' or 'best', got {outlier_rule!r}")
    shape = csr.shape
    k = len(values)
    rows, cols = _nonzero(csr)
    model = dict(
        abilities=values, go_ability=go_ability, throughput=throughput, wakeup_s=wakeup_s,
        sparsity_threshold=sparsity_threshold, element_size=element_size, ability_unit=ability_unit,
    )

    start = time.perf_counter()
    row_labels, col_labels = spectral_coclusters(
        rows, cols, shape, k, seed=seed, max_cluster_nnz=max_cluster_nnz, svd_method=svd_method
    )
    cluster_s = time.perf_counter() - start
    label_r, label_c = row_labels[rows], col_labels[cols]
    outlier = label_r != label_c
    if outlier_rule in ("auto", "best"):
        n_out_rows = _distinct(rows[outlier]).size
        n_out_cols = _distinct(cols[outlier]).size
        paper_rule = "row" if n_out_cols < n_out_rows else "col"
    rules = ["row", "col"] if outlier_rule == "best" else [paper_rule if outlier_rule == "auto" else outlier_rule]

    candidates = []
    for rule in rules:
        label = np.where(outlier, label_r if rule == "row" else label_c, label_r)
        # rank co-clusters by the compute of their initial parts; the biggest go to the most able workers
        loads = _Loads(rows, cols, label, shape, k, model)
        cost = [compute_cost(loads.nnz[s], loads.n_rows[s], loads.n_cols[s], sparsity_threshold) for s in range(k)]
        by_cost = sorted(range(k), key=lambda s: (-cost[s], s))
        by_ability = sorted(range(k), key=lambda i: (-values[i], i))
        to_worker = np.empty(k, dtype=np.int64)
        to_worker[by_cost] = by_ability
        owner = to_worker[label]
        info = {
            "cluster_s": cluster_s, "outliers": int(outlier.sum()),
            "cocluster_nnz": np.bincount(to_worker[label_r[~outlier]], minlength=k).tolist(),
            # bytes before FGCP (MSCC alone), per worker
            "initial_bytes": [
                int(loads.n_rows[s] + loads.n_cols[s]) * element_size for s in np.argsort(to_worker)
            ],
        }
        start = time.perf_counter()
        if fgcp:
            info.update(_fgcp(rows, cols, owner, outlier, rule, shape, k, model))
        else:
            info.update({"rule": rule, "moves": 0, "offloaded_nnz": 0})
        info["fgcp_s"] = time.perf_counter() - start
        plan = FCPartition(shape, rows, cols, owner, values, "mscc+fgcp" if fgcp else "mscc", **_model_kwargs(model), info=info)
        candidates.append(plan)
    if len(candidates) > 1:
        candidates.sort(key=lambda p: (max(max(p.estimated_s()), p.go_compute_s()), p.total_bytes()))
    plan = candidates[0]
    log.debug("%s", plan.summary())
    return plan


def _model_kwargs(model: dict) -> dict:
    return {key: model[key] for key in model if key != "abilities"}


# --------------------------------------------------------------------------------------------------
# Test and benchmark matrices
# --------------------------------------------------------------------------------------------------


def _sample_exact(rng: np.random.Generator, population: int, n: int, chunk: int = 1 << 23) -> np.ndarray:
    """``n`` distinct sorted integers from ``range(population)``, in chunks (memory stays ~``chunk``)."""
    if not 0 <= n <= population:
        raise ValueError(f"cannot pick {n} of {population}")
    starts = np.arange(0, population, chunk, dtype=np.int64)
    sizes = np.minimum(chunk, population - starts)
    counts = rng.multivariate_hypergeometric(sizes, n, method="marginals") if starts.size > 1 else np.array([n])
    out = [s + np.sort(rng.choice(size, m, replace=False)) for s, size, m in zip(starts, sizes, counts) if m]
    return np.concatenate(out).astype(np.int64) if out else np.zeros(0, dtype=np.int64)


def _nonzero_values(rng: np.random.Generator, n: int, dtype) -> np.ndarray:
    values = rng.standard_normal(n, dtype=np.float32).astype(dtype)
    values[values == 0] = 1
    return values


def _assemble(rows, cols, values, shape, as_sparse: bool):
    csr = sp.csr_matrix((values, (rows, cols)), shape=shape)
    csr.sort_indices()
    return csr if as_sparse else csr.toarray()


def _n_nonzeros(rows: int, cols: int, sparsity: float) -> int:
    if not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"sparsity is a fraction of zeros in [0, 1], got {sparsity}")
    if rows < 1 or cols < 1:
        raise ValueError(f"rows and cols must be positive, got {rows}, {cols}")
    return int(round((1.0 - sparsity) * rows * cols))


def random_sparse_matrix(
    rows: int, cols: int, sparsity: float, seed: int = 0, *, as_sparse: bool = False, dtype=np.float32
):
    """A ``rows x cols`` matrix with exactly ``round((1 - sparsity) * rows * cols)`` nonzeros at
    uniformly random positions (standard-normal values): no co-cluster structure.

    Returns a dense numpy array, or a scipy CSR matrix with ``as_sparse`` (VGG-16's fc6 is 400 MB
    dense).

    Example::

        >>> W = random_sparse_matrix(100, 200, sparsity=0.9, seed=0)
        >>> W.shape, int((W != 0).sum())
        ((100, 200), 2000)
    """
    n = _n_nonzeros(rows, cols, sparsity)
    rng = np.random.default_rng(seed)
    flat = _sample_exact(rng, rows * cols, n)
    return _assemble(flat // cols, flat % cols, _nonzero_values(rng, n, dtype), (rows, cols), as_sparse)


def block_sparse_matrix(
    rows: int,
    cols: int,
    blocks: int,
    sparsity: float,
    outlier_fraction: float = 0.1,
    seed: int = 0,
    *,
    as_sparse: bool = False,
    dtype=np.float32,
):
    """A block-structured sparse matrix, like a group-lasso-pruned layer: ``blocks`` dense-ish
    diagonal blocks hidden by a random row and column permutation, plus scattered outliers.

    Rows and columns are cut into ``blocks`` near-equal groups; block ``b`` is rows group ``b`` x
    columns group ``b``. Of the ``round((1 - sparsity) * rows * cols)`` nonzeros, a fraction
    ``outlier_fraction`` is spread uniformly over the positions outside the blocks and the rest
    uniformly inside them (so the in-block density is ``(1 - sparsity) * (1 - outlier_fraction) *
    blocks`` for equal blocks). Where that would exceed 1 (a dense layer cut into many blocks,
    e.g. 70% sparsity with 4 blocks) the blocks are filled completely and the excess becomes
    outliers; the overall sparsity is always exact.

    Example::

        >>> W = block_sparse_matrix(400, 600, blocks=3, sparsity=0.9, outlier_fraction=0.1, seed=0)
        >>> W.shape, int((W != 0).sum())
        ((400, 600), 24000)
    """
    n = _n_nonzeros(rows, cols, sparsity)
    if not 1 <= blocks <= min(rows, cols):
        raise ValueError(f"blocks must be in 1..{min(rows, cols)}, got {blocks}")
    if not 0.0 <= outlier_fraction <= 1.0:
        raise ValueError(f"outlier_fraction must be in [0, 1], got {outlier_fraction}")
    rng = np.random.default_rng(seed)
    rb = np.r_[0, np.cumsum(proportional_sizes(rows, [1] * blocks))]
    cb = np.r_[0, np.cumsum(proportional_sizes(cols, [1] * blocks))]
    areas = np.diff(rb) * np.diff(cb)
    inside = min(n - int(round(outlier_fraction * n)), int(areas.sum()))
    outside = n - inside
    if outside > rows * cols - int(areas.sum()):
        raise ValueError(f"{outside} outliers do not fit outside the blocks; lower outlier_fraction")
    rr, cc = [], []
    per_block = rng.multivariate_hypergeometric(areas, inside, method="marginals") if blocks > 1 else np.array([inside])
    for b in range(blocks):
        flat = _sample_exact(rng, int(areas[b]), int(per_block[b]))
        width = cb[b + 1] - cb[b]
        rr.append(rb[b] + flat // width)
        cc.append(cb[b] + flat % width)
    # outliers: an exact uniform sample of the positions outside the blocks, enumerated row by row
    row_block = np.searchsorted(rb, np.arange(rows), side="right") - 1
    widths = np.diff(cb)
    offsets = np.r_[0, np.cumsum(cols - widths[row_block])]
    flat = _sample_exact(rng, int(offsets[-1]), outside)
    r_out = np.searchsorted(offsets, flat, side="right") - 1
    j, b = flat - offsets[r_out], row_block[r_out]
    rr.append(r_out)
    cc.append(np.where(j < cb[b], j, j + widths[b]))
    r_perm, c_perm = rng.permutation(rows), rng.permutation(cols)
    r_all, c_all = r_perm[np.concatenate(rr)], c_perm[np.concatenate(cc)]
    return _assemble(r_all, c_all, _nonzero_values(rng, n, dtype), (rows, cols), as_sparse)
