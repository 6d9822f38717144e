"""Simulated heterogeneity: make some work slower, steadily or transiently (plain Python).

:func:`stretch` sleeps so that work that took ``t`` seconds lasts ``factor * t``: the one place
that turns a slowdown into sleeping (pipeline stages and partitioned-inference layers use it).
:class:`StepStretcher` does it for a rank's training steps, times ``straggle_factor`` on the steps
it draws as stragglers; the Lightning callback that applies it to every training batch is
:class:`lightning_hybrid.callbacks.HeterogeneitySimulator`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

def stretch(elapsed: float, factor: float, sleep: Callable[[float], None] = time.sleep) -> float:
    """Sleep so that work that took ``elapsed`` seconds lasts ``factor`` times as long; return the
    seconds slept.

    Example::

        >>> stretch(0.01, 1.0)
        0.0
    """
    extra = max(0.0, elapsed * (factor - 1.0))
    if extra > 0.0:
        sleep(extra)
    return extra


@dataclass
class StepStretcher:
    """Stretches measured steps of one rank.

    Args:
        factor: steady slowdown; a step that took ``t`` seconds is made to last ``factor * t``.
        straggle_prob: probability that a step is a transient straggler.
        straggle_factor: extra slowdown of a straggler step (on top of ``factor``).
        seed: seed of the straggler draws, so a run's stragglers are reproducible.

    Example::

        >>> s = StepStretcher(factor=2.0)
        >>> s.extra_time(0.1)
        0.1
    """

    factor: float = 1.0
    straggle_prob: float = 0.0
    straggle_factor: float = 1.0
    seed: int | Sequence[int] = 0
    steps: int = field(default=0, init=False)
    stragglers: int = field(default=0, init=False)
    slept: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        if not self.factor >= 1.0:
            raise ValueError(f"slowdown factor must be >= 1.0 (a rank can be slowed, not sped up), got {self.factor}")
        if not 0.0 <= self.straggle_prob <= 1.0:
            raise ValueError(f"straggle_prob must be a probability in [0, 1], got {self.straggle_prob}")
        if not self.straggle_factor >= 1.0:
            raise ValueError(f"straggle_factor must be >= 1.0, got {self.straggle_factor}")
        self._rng = np.random.default_rng(self.seed)

    def _next_factor(self) -> float:
        """This step's slowdown (draws the straggler coin)."""
        total = self.factor
        if self.straggle_prob > 0.0 and self._rng.random() < self.straggle_prob:
            total *= self.straggle_factor
            self.stragglers += 1
        self.steps += 1
        return total

    def extra_time(self, elapsed: float) -> float:
        """Seconds to add to a step that took ``elapsed`` seconds (draws the straggler coin)."""
        return max(0.0, elapsed * (self._next_factor() - 1.0))

    def stretch(self, elapsed: float) -> float:
        """Sleep the extra time for a step that took ``elapsed`` seconds; return the time slept."""
        extra = stretch(elapsed, self._next_factor())
        self.slept += extra
        return extra
