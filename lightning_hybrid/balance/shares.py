"""Each rank's share of a global batch, proportional to its speed (largest-remainder rounding).

:func:`apportion` turns relative speeds into whole sample counts that sum to the global batch,
each at least ``min_share``; :func:`worth_changing` says whether new shares would shorten the step
by more than a tolerance (measured speeds are noisy: equal devices must not swap samples back and
forth); :func:`check_speeds` and :func:`check_global_batch` are the checks a strategy runs before its
processes start.

Example::

    >>> apportion(32, [1.0, 3.0])
    [8, 24]
    >>> apportion(10, [1.0, 1.0, 1.0])
    [4, 3, 3]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from lightning_hybrid.devices import positive_per_device


def check_speeds(speeds: Sequence[float], world_size: int | None = None) -> list[float]:
    """``speeds`` as floats; a ValueError unless they are positive finite numbers, one per rank."""
    return positive_per_device(speeds, "speeds", world_size, per="rank", instead=", or speeds=None to measure them")


def check_global_batch(global_batch: int, world_size: int, min_share: int = 1) -> None:
    """A ValueError unless every one of ``world_size`` ranks can get ``min_share`` samples of ``global_batch``."""
    if global_batch < world_size:
        raise ValueError(
            f"global_batch={global_batch} is smaller than the number of ranks ({world_size}): a rank would train on "
            "zero samples per step; use a global batch of at least one sample per rank"
        )
    if global_batch < world_size * min_share:
        raise ValueError(
            f"global_batch={global_batch} cannot give each of {world_size} ranks min_share={min_share} samples "
            f"(that needs {world_size * min_share}); lower min_share or raise global_batch"
        )


def apportion(total: int, speeds: Sequence[float], min_share: int = 1) -> list[int]:
    """Split ``total`` samples over the ranks in proportion to ``speeds``.

    Ranks whose proportional quota is below ``min_share`` get exactly ``min_share`` and the rest is
    split over the others in proportion (repeated until every quota reaches ``min_share``); the
    quotas are then rounded down and the samples left over go one each to the largest fractional
    parts (ties: the faster rank, then the lower rank). Deterministic, so every rank computing it
    from the same speeds gets the same shares.
    """
    weights = check_speeds(speeds)
    if isinstance(min_share, bool) or not isinstance(min_share, int) or min_share < 1:
        raise ValueError(f"min_share must be a positive integer (a rank cannot train on zero samples), got {min_share!r}")
    check_global_batch(total, len(weights), min_share)
    fixed: set[int] = set()
    while True:
        free = [i for i in range(len(weights)) if i not in fixed]
        rest = total - min_share * len(fixed)
        weight_sum = sum(weights[i] for i in free)
        quotas = {i: rest * weights[i] / weight_sum for i in free}
        short = {i for i, q in quotas.items() if q < min_share}
        if not short or len(short) == len(free):  # the latter only by float rounding at total == ranks x min_share
            break
        fixed |= short
    shares = [min_share] * len(weights)
    for i, quota in quotas.items():
        shares[i] = max(min_share, math.floor(quota))
    left = total - sum(shares)
    order = sorted(quotas, key=lambda i: (-(quotas[i] - math.floor(quotas[i])), -weights[i], i))
    for i in order[:left]:
        shares[i] += 1
    return shares


def step_time(shares: Sequence[int], speeds: Sequence[float]) -> float:
    """The predicted time of a synchronous step: the slowest rank's ``share / speed``."""
    return max(share / speed for share, speed in zip(shares, speeds))


def worth_changing(current: Sequence[int], proposed: Sequence[int], speeds: Sequence[float], tolerance: float) -> bool:
    """Whether ``proposed`` shares shorten the predicted step of ``current`` by more than ``tolerance``
    (a fraction) at ``speeds``.

    Example::

        >>> worth_changing([64, 64], [66, 62], [1.03, 0.97], tolerance=0.05)  # noise between equal devices
        False
        >>> worth_changing([64, 64], [102, 26], [4.0, 1.0], tolerance=0.05)   # one device 4x slower
        True
    """
    return step_time(proposed, speeds) < (1.0 - tolerance) * step_time(current, speeds)
