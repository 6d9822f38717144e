"""Sharing ``n`` items (rows, columns, output rows) among workers in proportion to their abilities.

Both the FC partitions (:func:`~lightning_hybrid.partition.rows_partition`) and the spatial split
of the convolutional part (BODP) cut work this way; the abilities only count through their ratios
here, so any unit (see :mod:`lightning_hybrid.devices`) gives the same shares.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


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


def proportional_split(length: int, abilities: Sequence[float]) -> list[tuple[int, int]]:
    """Contiguous ranges of ``range(length)`` with sizes proportional to ``abilities`` (largest remainders).

    Example::

        >>> proportional_split(10, [1, 1, 2])
        [(0, 3), (3, 5), (5, 10)]
    """
    bounds = [0]
    for size in proportional_sizes(length, abilities):
        bounds.append(bounds[-1] + size)
    return list(zip(bounds, bounds[1:]))
