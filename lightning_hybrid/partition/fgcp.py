"""MSCC + FGCP: MoDNN's partition of a sparse fully-connected layer (sections 5.2-5.3).

:func:`mscc_fgcp_partition` gives each worker one dense co-cluster of ``W``'s nonzero pattern
(:func:`~lightning_hybrid.partition.mscc.spectral_coclusters`), then balances the *outliers*
(nonzeros outside the co-clusters) between the workers and the group owner by the fine-grain cross
partition (FGCP): the slowest worker offloads its smallest outlier groups to the GO as long as the
plan's estimated makespan does not rise, under the cost model of
:mod:`~lightning_hybrid.partition.fc_cost`. The result is an
:class:`~lightning_hybrid.partition.fc_partition.FCPartition`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np

from lightning_hybrid.partition.fc_cost import (
    ABILITY_UNIT,
    DEFAULT_THROUGHPUT,
    DEFAULT_WAKEUP_S,
    GO,
    check_abilities,
    check_model,
    compute_cost,
    compute_seconds,
)
from lightning_hybrid.partition.fc_partition import FCPartition
from lightning_hybrid.partition.mscc import spectral_coclusters
from lightning_hybrid.partition.sparse import distinct_indices, nonzero_coords, to_csr
from lightning_hybrid.partition.sparsity import PAPER_SPARSITY_THRESHOLD

log = logging.getLogger(__name__)


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
            return compute_seconds(cost, m["go_ability"], m["ability_unit"])
        if nnz == 0:
            return 0.0
        sent = (n_rows + n_cols) * m["element_size"]
        # compute_seconds + transfer_seconds of a busy worker (it always sends), summed left to right
        return compute_seconds(cost, m["abilities"][slot], m["ability_unit"]) + sent / m["throughput"] + m["wakeup_s"]

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

    Abilities and ``go_ability`` are in GMAC/s by default; units and the ET formula are in
    :mod:`~lightning_hybrid.partition.fc_cost`. What to expect (``benchmarks/fc_transfer.py``):
    scattered outliers touch almost every row (column), so MSCC alone saves little; the saving comes
    from FGCP moving the
    outliers to the GO, down to about ``r + c`` elements in all, and so depends on how fast the GO
    is relative to the wake-up and transfer time it saves. ``max_cluster_nnz`` clusters a sample of
    the pattern (for very large layers; VGG-16's fc6 at 70% sparsity, 31 M nonzeros, clusters in
    about 5 s on 2 cores without it; a dense layer has r*c nonzeros and may want it). ``plan.info`` records the co-cluster sizes, the outliers,
    FGCP's moves and the clustering time.

    Example::

        >>> from lightning_hybrid.partition import block_sparse_matrix, rows_partition
        >>> W = block_sparse_matrix(120, 180, blocks=3, sparsity=0.9, outlier_fraction=0.1, seed=0)
        >>> plan = mscc_fgcp_partition(W, [1.0, 1.0, 2.0], go_ability=2.0)
        >>> plan.total_bytes() < rows_partition(W, [1.0, 1.0, 2.0]).total_bytes()
        True
    """
    csr = to_csr(W)
    values = check_abilities(abilities, workers)
    check_model(go_ability, throughput, wakeup_s, sparsity_threshold, element_size)
    if outlier_rule not in ("auto", "row", "col", "best"):
        raise ValueError(f"outlier_rule must be 'auto', 'row', 'col' or 'best', got {outlier_rule!r}")
    shape = csr.shape
    k = len(values)
    rows, cols = nonzero_coords(csr)
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
        n_out_rows = distinct_indices(rows[outlier]).size
        n_out_cols = distinct_indices(cols[outlier]).size
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
