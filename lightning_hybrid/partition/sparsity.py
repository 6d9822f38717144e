"""When is a sparse (CSR) matrix-vector product faster than a dense one on this machine?

MoDNN (Mao et al. 2017, sections 3.3 and 5.1) gives each device a *sparsity threshold*
``Thld[i](r, c)``: the sparsity at which an ``r x c`` matrix takes the same time with SpMV (a
linked list / CSR of the nonzeros) as with GEMV (a dense array). A part of a layer is computed
with SpMV when it is sparser than that, with GEMV otherwise.

Which way the threshold is defined, explicitly: in this module **sparsity is the fraction of
zeros** (``1 - nnz / (r * c)``), and the threshold is the sparsity *above* which SpMV is faster.
The paper writes its measured value as "SpMV only taken as priority when the matrix sparsity is
below approximately 15.8%", where "sparsity" can only mean the fraction of *nonzeros* (it also
says SpMV is "much slower than GEMV" per element, which a threshold of 15.8% zeros would
contradict). So the paper's threshold is a density of 15.8%, a sparsity of 84.2% in our terms:
:data:`PAPER_DENSITY_THRESHOLD` and :data:`PAPER_SPARSITY_THRESHOLD`.

:func:`measure_sparsity_threshold` times ``torch`` CSR products against dense ones over a grid of
sparsities; the paper fits a line to its SpMV timings (time proportional to nonzeros), we read the
crossing off the measured timings directly (see :func:`threshold_from_timings`).
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

PAPER_DENSITY_THRESHOLD = 0.158
"""MoDNN's measured threshold on a Nexus 5 (section 7.1), as a fraction of nonzeros."""

PAPER_SPARSITY_THRESHOLD = 1.0 - PAPER_DENSITY_THRESHOLD
"""The same threshold as a fraction of zeros (0.842): SpMV is used for parts sparser than this."""

DEFAULT_SPARSITIES = (0.0, 0.5, 0.7, 0.8, 0.85, 0.9, 0.93, 0.96, 0.98, 0.99)


@dataclass(frozen=True)
class SparsityTimings:
    """Measured SpMV and GEMV times of one shape, and the threshold read off them.

    Args:
        rows, cols: the shape measured (possibly scaled down from the one asked for, see
            :func:`sparsity_timings`'s ``max_elements``).
        batch: number of right-hand-side vectors (1: matrix-vector).
        sparsities: the fractions of zeros measured, ascending.
        spmv_s: seconds per CSR product at each sparsity (best of the repeats).
        gemv_s: seconds per dense product (independent of the sparsity).
        threshold: the sparsity above which SpMV is faster, in ``[0, 1]``.
    """

    rows: int
    cols: int
    batch: int
    sparsities: tuple[float, ...]
    spmv_s: tuple[float, ...]
    gemv_s: float
    threshold: float

    @property
    def density_threshold(self) -> float:
        """The threshold as a fraction of nonzeros: SpMV is faster below this density."""
        return 1.0 - self.threshold

    def spmv_faster(self, sparsity: float) -> bool:
        """Whether a matrix of this ``sparsity`` (fraction of zeros) should use SpMV."""
        return sparsity > self.threshold

    def envelope_s(self) -> tuple[float, ...]:
        """The SpMV timings made non-increasing in sparsity (each the max over it and every sparser point).

        The threshold is the crossing of this envelope with :attr:`gemv_s`, so at every measured
        sparsity above the threshold the envelope is below the GEMV time, and at or below the
        threshold it is not.
        """
        return _envelope(self.spmv_s)


def _envelope(times: Sequence[float]) -> tuple[float, ...]:
    out = list(times)
    for i in range(len(out) - 2, -1, -1):
        out[i] = max(out[i], out[i + 1])
    return tuple(out)


def threshold_from_timings(sparsities: Sequence[float], spmv_s: Sequence[float], gemv_s: float) -> float:
    """The sparsity above which SpMV beats GEMV, from timings at ascending ``sparsities``.

    Timings are noisy, so the SpMV times are first made non-increasing in sparsity (each replaced
    by the largest time at it or any sparser point: conservative, SpMV must win at every sparser
    point too); the threshold is where that envelope crosses ``gemv_s``, linearly interpolated
    between the two grid points around the crossing. If SpMV loses even at the sparsest point it
    is ``1.0`` (never use SpMV); if it wins at the densest point measured, that point.

    Example::

        >>> threshold_from_timings([0.5, 0.8, 0.9], [3.0, 2.0, 1.0], gemv_s=1.5)
        0.85
    """
    s = [float(v) for v in sparsities]
    if len(s) != len(spmv_s) or not s:
        raise ValueError("sparsities and spmv_s must be non-empty and of equal length")
    if any(b <= a for a, b in zip(s, s[1:])) or s[0] < 0 or s[-1] > 1:
        raise ValueError(f"sparsities must be strictly ascending within [0, 1], got {s}")
    env = _envelope(spmv_s)
    slower = [i for i, t in enumerate(env) if t >= gemv_s]
    if not slower:
        return s[0]
    i = slower[-1]  # env is non-increasing, so every point up to i is slower, every point after faster
    if i == len(s) - 1:
        return 1.0
    t0, t1 = env[i], env[i + 1]
    frac = (t0 - gemv_s) / (t0 - t1) if t0 > t1 else 0.0
    return round(min(1.0, max(0.0, s[i] + frac * (s[i + 1] - s[i]))), 12)


def _best_time(fn, repeats: int, min_time_s: float) -> float:
    fn()  # warm-up (the first CSR product allocates workspaces)
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    number = max(1, min(1000, int(min_time_s / once)))
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - start) / number)
    return best


@functools.lru_cache(maxsize=64)
def _cached_timings(
    rows: int, cols: int, batch: int, sparsities: tuple[float, ...], repeats: int, min_time_s: float,
    dtype: torch.dtype, seed: int, threads: int,
) -> SparsityTimings:
    generator = torch.Generator().manual_seed(seed)
    dense = torch.randn(rows, cols, generator=generator, dtype=torch.float32).to(dtype)
    x = torch.randn(cols, batch, generator=generator, dtype=torch.float32).to(dtype)
    if batch == 1:
        x = x[:, 0]
    uniform = torch.rand(rows, cols, generator=generator)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
        gemv_s = _best_time(lambda: dense @ x, repeats, min_time_s)
        spmv_s = []
        for sparsity in sparsities:
            csr = (dense * (uniform >= sparsity)).to_sparse_csr()
            spmv_s.append(_best_time(lambda: csr @ x, repeats, min_time_s))
    return SparsityTimings(
        rows=rows, cols=cols, batch=batch, sparsities=sparsities, spmv_s=tuple(spmv_s), gemv_s=gemv_s,
        threshold=threshold_from_timings(sparsities, spmv_s, gemv_s),
    )


def sparsity_timings(
    rows: int,
    cols: int,
    *,
    batch: int = 1,
    sparsities: Sequence[float] = DEFAULT_SPARSITIES,
    repeats: int = 3,
    min_time_s: float = 2e-3,
    max_elements: int = 1 << 21,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> SparsityTimings:
    """Time CSR and dense products of an ``rows x cols`` matrix on this machine (cached per shape).

    Each product is timed ``repeats`` times over enough calls to last ``min_time_s``, and the best
    is kept. A shape with more than ``max_elements`` entries is measured on the same aspect ratio
    scaled down to ``max_elements`` (the threshold is a density and depends on the shape only
    weakly), so a call stays cheap at setup: about 0.1-0.3 s for the defaults on a 2-core CPU.
    Results are cached per (shape, batch, grid, dtype, seed, torch thread count) for the process.

    Example::

        >>> t = sparsity_timings(256, 256, sparsities=(0.0, 0.9, 0.99))
        >>> len(t.spmv_s), 0.0 <= t.threshold <= 1.0
        (3, True)
    """
    if rows < 1 or cols < 1 or batch < 1:
        raise ValueError(f"rows, cols and batch must be positive, got {rows}, {cols}, {batch}")
    if rows * cols > max_elements:
        scale = math.sqrt(max_elements / (rows * cols))
        rows, cols = max(1, round(rows * scale)), max(1, round(cols * scale))
    grid = tuple(float(s) for s in sparsities)
    return _cached_timings(
        rows, cols, batch, grid, repeats, float(min_time_s), dtype, seed, torch.get_num_threads()
    )


def measure_sparsity_threshold(rows: int, cols: int, **kwargs) -> float:
    """The sparsity (fraction of zeros) above which a CSR product beats a dense one on this machine.

    Returns a value in ``[0, 1]``: use SpMV for a part whose sparsity is above it, GEMV otherwise
    (``1.0``: SpMV never won). MoDNN's value on a Nexus 5 was a density of 15.8%, i.e. a sparsity of
    0.842 in these terms (:data:`PAPER_SPARSITY_THRESHOLD`). Keyword arguments go to
    :func:`sparsity_timings` (which has the timings behind the number, and caches them per shape).

    Example::

        >>> s = measure_sparsity_threshold(512, 512)
        >>> 0.0 <= s <= 1.0
        True
    """
    return sparsity_timings(rows, cols, **kwargs).threshold
