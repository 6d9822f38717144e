# Generated from lightning_hybrid/data/split.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""Deterministic, seeded index splits."""

from __future__ import annotations

import numpy as np


def seeded_split(n: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split ``range(n)`` into sorted train and validation indices, the same for the same seed.

    The validation part has ``round(n * val_fraction)`` indices (at least one when the fraction
    is positive and ``n > 1``), chosen by a permutation from ``numpy.random.default_rng(seed)``.
    """
    n_val = int(round(n * val_fraction))
    if val_fraction > 0 and n > 1:
        n_val = min(max(n_val, 1), n - 1)
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[n_val:]), np.sort(order[:n_val])
