"""Measured speeds: each rank's samples per second of its own time, smoothed over measurements.

A rank's :class:`Meter` adds up, step by step, the samples it trained on, the seconds of its own
(its whole cycle from the previous all-reduce's end until its last gradient bucket was ready: data,
hooks, callbacks, forward, backward, optimizer; see :mod:`~lightning_hybrid.balance.hook`) and the
seconds it then waited for the all-reduce. When the ranks rebalance they gather their meters and
:class:`SpeedEstimator` turns samples / own time into smoothed speeds, the same on every rank.

Example::

    >>> estimator = SpeedEstimator(smoothing=0.5)
    >>> estimator.update(samples=[100, 100], busy_s=[1.0, 4.0])
    [100.0, 25.0]
    >>> estimator.update(samples=[100, 100], busy_s=[1.0, 2.0])
    [100.0, 37.5]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from typing import Any


@dataclass
class Meter:
    """This rank's training since the meter was last taken."""

    samples: float = 0.0
    busy_s: float = 0.0
    wait_s: float = 0.0

    def add(self, samples: float, busy_s: float, wait_s: float) -> None:
        self.samples += samples
        self.busy_s += busy_s
        self.wait_s += wait_s

    def take(self) -> tuple[float, float, float]:
        """``(samples, busy_s, wait_s)``, and start again from zero."""
        values = astuple(self)
        self.samples = self.busy_s = self.wait_s = 0.0
        return values


class SpeedEstimator:
    """Each rank's speed in samples per second of its own time, smoothed exponentially.

    Args:
        smoothing: the weight of the newest measurement (``1``: no smoothing).
    """

    def __init__(self, smoothing: float = 0.5) -> None:
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1] (the weight of the newest measurement), got {smoothing!r}")
        self.smoothing = float(smoothing)
        #: The smoothed speeds, one per rank; ``None`` before the first measurement.
        self.speeds: list[float] | None = None

    def update(self, samples: Sequence[float], busy_s: Sequence[float]) -> list[float] | None:
        """Fold in one measurement of every rank; one that measured nothing leaves the speeds as they are."""
        if any(not (s > 0 and c > 0 and math.isfinite(s / c)) for s, c in zip(samples, busy_s)):
            return self.speeds
        new = [float(s) / float(c) for s, c in zip(samples, busy_s)]
        if self.speeds is None or len(self.speeds) != len(new):
            self.speeds = new
        else:
            a = self.smoothing
            self.speeds = [(1 - a) * old + a * now for old, now in zip(self.speeds, new)]
        return self.speeds

    def state_dict(self) -> dict[str, Any]:
        return {"speeds": None if self.speeds is None else list(self.speeds)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        speeds = state.get("speeds")
        self.speeds = None if speeds is None else [float(s) for s in speeds]
