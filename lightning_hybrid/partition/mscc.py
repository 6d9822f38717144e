"""MSCC: spectral co-clustering of a sparse layer's nonzero pattern (MoDNN section 5.2).

:func:`spectral_coclusters` labels every nonempty row and column of ``W``'s 0/1 pattern with one of
``k`` co-clusters (one per worker), with scikit-learn's ``SpectralCoclustering`` (Dhillon's
bipartite spectral co-clustering); large patterns can be clustered on a sample of their nonzeros.
:func:`~lightning_hybrid.partition.fgcp.mscc_fgcp_partition` turns the labels into a plan.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from lightning_hybrid.partition.sparse import distinct_indices


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

        >>> from lightning_hybrid.partition import block_sparse_matrix
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
    active_rows, active_cols = distinct_indices(rows), distinct_indices(cols)
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
    ur, uc = distinct_indices(sr), distinct_indices(sc)
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
