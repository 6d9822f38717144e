"""Simulated heterogeneity: make some work slower, steadily or transiently (plain Python).

:func:`stretch` sleeps so that work that took ``t`` seconds lasts ``factor * t``: the one place
that turns a slowdown into sleeping (pipeline stages and partitioned-inference layers use it).
:class:`StepStretcher` does it for a rank's training steps, times ``straggle_factor`` on the steps
it draws as stragglers. :class:`SlowBatches` makes a DataLoader's batches arrive later: a collate
function that sleeps ``factor - 1`` times the rank's work per sample for each sample of a batch.
The Lightning callback that applies them is :class:`lightning_hybrid.callbacks.HeterogeneitySimulator`;
where the time goes (:data:`WHERE`) is its ``where`` argument.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

#: Where a simulated slowdown puts its time in a rank's training cycle: ``"compute"`` (its forward
#: and backward, inside the strategy where it times them), ``"after_step"`` (a sleep after the
#: optimizer step, as a heavy callback or logging would take) and ``"data"`` (the rank's DataLoader
#: delivers each batch later, as a slow disk or decoder would).
WHERE = ("compute", "after_step", "data")


def check_where(where: str) -> str:
    """``where`` if it is one of :data:`WHERE`, else a ValueError saying which are."""
    if where not in WHERE:
        raise ValueError(f"where must be one of {', '.join(map(repr, WHERE))} (where the slowdown's time goes), got {where!r}")
    return where

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

    def next_factor(self) -> float:
        """The next step's slowdown (draws the straggler coin)."""
        total = self.factor
        if self.straggle_prob > 0.0 and self._rng.random() < self.straggle_prob:
            total *= self.straggle_factor
            self.stragglers += 1
        self.steps += 1
        return total

    def extra_time(self, elapsed: float) -> float:
        """Seconds to add to a step that took ``elapsed`` seconds (draws the straggler coin)."""
        return max(0.0, elapsed * (self.next_factor() - 1.0))

    def stretch(self, elapsed: float) -> float:
        """Sleep the extra time for a step that took ``elapsed`` seconds; return the time slept."""
        extra = stretch(elapsed, self.next_factor())
        self.slept += extra
        return extra


class SlowBatches:
    """A collate function that makes a DataLoader's batches ``factor`` times slower to arrive.

    Wraps ``collate_fn``: after collating a batch of ``n`` samples it sleeps
    ``(factor - 1) * n * per_sample_s``, where ``factor`` is the next draw of ``stretcher`` (steady
    slowdown and transient stragglers) and ``per_sample_s`` the rank's work per sample, read from
    ``per_sample_s`` (a ``multiprocessing.Value``, so that DataLoader worker processes see the value
    the training process keeps measuring; before the first measurement nothing is slept). The
    sleep happens where the DataLoader runs: in the training process (``num_workers=0``) or in its
    workers, where prefetching may hide it, as it would a slow disk's; ``stretcher.slept`` adds it
    up in the process that sleeps.

    Example::

        >>> import multiprocessing
        >>> per_sample = multiprocessing.Value("d", 0.0)
        >>> collate = SlowBatches(list, StepStretcher(factor=4.0), per_sample)
        >>> collate([1, 2, 3])  # nothing measured yet: no sleep
        [1, 2, 3]
    """

    def __init__(self, collate_fn: Callable, stretcher: StepStretcher, per_sample_s) -> None:
        self.collate_fn, self.stretcher, self.per_sample_s = collate_fn, stretcher, per_sample_s

    def __call__(self, samples):
        batch = self.collate_fn(samples)
        self.stretcher.slept += stretch(len(samples) * self.per_sample_s.value, self.stretcher.next_factor())
        return batch
