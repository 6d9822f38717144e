"""Sparse matrices: any 2-D matrix as a canonical scipy CSR, its nonzeros' coordinates, and test matrices.

The FC partitions (:mod:`~lightning_hybrid.partition.fc_partition`) take ``W`` as numpy, scipy
sparse or a dense or sparse torch tensor; :func:`to_csr` turns each into one canonical form
(duplicates summed, explicit zeros dropped, indices sorted) and :func:`nonzero_coords` lists its
nonzeros in row-major order, the order every plan indexes them by.

:func:`random_sparse_matrix` (no structure) and :func:`block_sparse_matrix` (hidden diagonal blocks
plus scattered outliers, like a group-lasso-pruned layer) make the layers the tests and
``benchmarks/fc_transfer.py`` partition, with an exact number of nonzeros.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from lightning_hybrid.partition.proportional import proportional_sizes

# --------------------------------------------------------------------------------------------------
# Input handling
# --------------------------------------------------------------------------------------------------


def to_csr(W) -> sp.csr_matrix:
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


def distinct_indices(index: np.ndarray) -> np.ndarray:
    """``np.unique`` of non-negative integers in O(n + max) instead of a sort."""
    if not index.size:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.bincount(index))


def nonzero_coords(csr: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """Row-major coordinates of a canonical CSR's entries (int64)."""
    rows = np.repeat(np.arange(csr.shape[0], dtype=np.int64), np.diff(csr.indptr))
    return rows, csr.indices.astype(np.int64)


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
