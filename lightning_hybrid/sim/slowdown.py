"""Simulated heterogeneity: make some ranks' training steps slower, steadily or transiently.

The core, :class:`StepStretcher`, knows nothing of Lightning: it takes how long a step really
took and sleeps so that the step lasts ``factor`` times as long, times ``straggle_factor`` on the
steps it draws as stragglers. :class:`HeterogeneitySimulator` is the Lightning callback that applies
it to every training batch of every rank, so any strategy can be tried under the same
heterogeneity on one machine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytorch_lightning as pl

log = logging.getLogger(__name__)


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

    def extra_time(self, elapsed: float) -> float:
        """Seconds to add to a step that took ``elapsed`` seconds (draws the straggler coin)."""
        total = self.factor
        if self.straggle_prob > 0.0 and self._rng.random() < self.straggle_prob:
            total *= self.straggle_factor
            self.stragglers += 1
        self.steps += 1
        return max(0.0, elapsed * (total - 1.0))

    def stretch(self, elapsed: float) -> float:
        """Sleep the extra time for a step that took ``elapsed`` seconds; return the time slept."""
        extra = self.extra_time(elapsed)
        if extra > 0.0:
            time.sleep(extra)
        self.slept += extra
        return extra


class HeterogeneitySimulator(pl.Callback):
    """Lightning callback: rank ``i`` 's training steps take ``slowdown[i]`` times as long.

    Each training batch (forward, backward and optimizer step) is timed, and the rank then sleeps
    the difference. Time the strategy reports as spent waiting for other processes (a
    ``communication_wait_s`` counter, as :class:`~lightning_hybrid.SSPStrategy` keeps) is not
    stretched: a slow device computes slowly, it does not wait longer. A strategy that can slow its
    own computation (``inject_compute_slowdown``, as :class:`~lightning_hybrid.HybridParallelStrategy`
    whose pipeline stages wait for each other within a step) is handed the factor instead. Steps are stretched as measured on the rank itself, so a strategy whose ranks
    wait for one another (DDP) slows to the slowest rank's pace, and one that lets ranks run ahead
    (SSP) does not: exactly the contrast the benchmarks measure.

    Args:
        slowdown: one factor per rank (``len == world size``), each >= 1; ``None`` for none.
        straggle_prob: per-step probability of a transient straggler, on every rank.
        straggle_factor: how much slower a straggler step is.
        seed: straggler draws use ``(seed, rank)``, so runs are reproducible.
        collective_latency_s: seconds of simulated network latency added to every gradient
            collective, for strategies that can take it (``AllReduceASGDStrategy``): a
            communication-bound setting on one machine.

    Example::

        >>> sim = HeterogeneitySimulator(slowdown=[1.0, 4.0])   # rank 1 is four times slower
        >>> # pl.Trainer(devices=2, strategy="ddp", callbacks=[sim])
    """

    def __init__(
        self,
        slowdown: Sequence[float] | None = None,
        straggle_prob: float = 0.0,
        straggle_factor: float = 3.0,
        seed: int = 0,
        collective_latency_s: float = 0.0,
    ) -> None:
        if not collective_latency_s >= 0:
            raise ValueError(f"collective_latency_s must be non-negative seconds, got {collective_latency_s}")
        self.collective_latency_s = float(collective_latency_s)
        self.slowdown = None if slowdown is None else [float(f) for f in slowdown]
        self.straggle_prob = float(straggle_prob)
        self.straggle_factor = float(straggle_factor)
        self.seed = int(seed)
        # Validate every factor now, in the launching process, before workers are started.
        for factor in self.slowdown or [1.0]:
            StepStretcher(factor, self.straggle_prob, self.straggle_factor)
        self.stretcher: StepStretcher | None = None
        self._step_start: float | None = None
        self._wait_start = 0.0

    @property
    def active(self) -> bool:
        """Whether this simulator changes anything at all."""
        return (
            any(f != 1.0 for f in self.slowdown or [])
            or (self.straggle_prob > 0 and self.straggle_factor > 1)
            or self.collective_latency_s > 0
        )

    def check_world_size(self, world_size: int) -> None:
        """Raise a ValueError when ``slowdown`` does not give exactly one factor per rank."""
        if self.slowdown is not None and len(self.slowdown) != world_size:
            raise ValueError(
                f"sim.slowdown has {len(self.slowdown)} factors {self.slowdown} but the run has {world_size} "
                f"training ranks; give one factor per rank, e.g. sim.slowdown=[{','.join(['1.0'] * world_size)}]"
            )

    def check_strategy(self, strategy: Any) -> None:
        """Raise a ValueError when a collective latency is asked of a strategy that cannot take it."""
        if self.collective_latency_s > 0 and not hasattr(strategy, "inject_collective_latency"):
            raise ValueError(
                f"sim.collective_latency_s={self.collective_latency_s} needs a strategy that can add latency to its "
                f"collectives (AllReduceASGDStrategy: strategy=allreduce_asgd); {type(strategy).__name__} cannot."
            )

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            # Inference: only a strategy that runs one input across ranks (partitioned inference) is slowed.
            if self.slowdown is not None and hasattr(trainer.strategy, "inject_compute_slowdown"):
                self.check_world_size(trainer.world_size)
                trainer.strategy.inject_compute_slowdown(self.slowdown[trainer.global_rank])
            return
        self.check_world_size(trainer.world_size)
        self.check_strategy(trainer.strategy)
        if self.collective_latency_s > 0:
            trainer.strategy.inject_collective_latency(self.collective_latency_s)
        rank = trainer.global_rank
        factor = self.slowdown[rank] if self.slowdown is not None else 1.0
        if hasattr(trainer.strategy, "inject_compute_slowdown"):
            # Pipeline stages wait for one another inside a step: slow the stage's compute itself.
            trainer.strategy.inject_compute_slowdown(factor)
            factor = 1.0
        self.stretcher = StepStretcher(factor, self.straggle_prob, self.straggle_factor, seed=(self.seed, rank))
        if self.active:
            log.info(
                "rank %d: simulated slowdown x%.2f, stragglers p=%.3f x%.2f",
                rank, factor, self.straggle_prob, self.straggle_factor,
            )

    @staticmethod
    def _waited(trainer: pl.Trainer) -> float:
        return float(getattr(trainer.strategy, "communication_wait_s", 0.0))

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        self._step_start = time.perf_counter()
        self._wait_start = self._waited(trainer)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.stretcher is None or self._step_start is None:
            return
        waited = self._waited(trainer) - self._wait_start
        self.stretcher.stretch(max(0.0, time.perf_counter() - self._step_start - waited))
        self._step_start = None
