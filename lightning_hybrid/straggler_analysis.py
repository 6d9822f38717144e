"""The straggler report's analysis, without Lightning: each rank's cycle split into its own work and its
wait, the slow rank and its pattern (:func:`analyse`), the advice the suite's measurements give for it
(:data:`ADVICE`), and the link's regime as said (:class:`LinkRegime`). The callback that times the batches
and says the findings is :class:`lightning_hybrid.straggler.StragglerReport`."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from lightning_hybrid.comm.regime import Regime

#: A rank whose own work per sample is at least this many times the others' median is slow.
SLOW_FACTOR = 1.5
#: ... in at least this fraction of its batches: persistent; in fewer (but its mean is slow): transient.
PERSISTENT_SHARE = 0.5
#: Slow in fewer batches, but at least this share of them, with a mean this many times the others': transient.
TRANSIENT_SHARE, TRANSIENT_FACTOR = 0.03, 1.25
#: Where the advice comes from: the grid's table of time to 98 % against DDP (LeNet-5, real MNIST, 2 ranks,
#: one 4x slower; medians of 3 seeds, each strategy at its best learning rate).
SOURCE = "recipes/zhang2017_delay_sync/README.md, the grid's 'LeNet-5, 98 %' table"
#: The figures the advice quotes: (lowest, highest) of DDP's time to 98 % over the strategy's, across the grid's
#: straggler sources (compute, a callback after each step, data loading, CPU contention) of one pattern.
#: ``tests/repository/test_numbers.py`` recomputes each from SOURCE's table.
MEASURED = {
    "persistent/balanced": (1.55, 2.26),
    "persistent/ssp": (1.48, 1.84),
    "transient/balanced,ssp,ssp_async": (0.86, 1.24),
    "transient/ssp_async/compute,after_step": (1.11, 1.18),
    "none/balanced,ssp,ssp_async": (1.01, 1.10),
}

#: Transient stragglers in the slow-link table (each rank 8x slower with probability 0.1 a step; LeNet-5 to 98 %,
#: 2 ranks, medians of 3 seeds): DDP's time over the contender's, measured end to end.
#: ``tests/repository/test_numbers.py`` reads them there.
FAMILY_SOURCE = "docs/strategies/delayed-averaging.md, 'Time to 98 % measured end to end under each source'"
FAMILY_TRANSIENT = {"local_h32": 1.40, "dga_d2": 1.07}


def _range(key: str) -> str:
    low, high = MEASURED[key]
    return f"{low:.2f}-{high:.2f}x"


#: What the measurements say to pick, by pattern.
ADVICE = {
    "persistent": (f"strategy=balanced: {_range('persistent/balanced')} DDP's time to accuracy under a persistent 4x "
                   f"straggler from compute, a callback, data loading or CPU contention (ssp: {_range('persistent/ssp')})"),
    "transient": (f"under transient stragglers the grid's strategies gained little: balanced, ssp and ssp_async ran at "
                  f"{_range('transient/balanced,ssp,ssp_async')} DDP's time to accuracy (ssp_async "
                  f"{_range('transient/ssp_async/compute,after_step')} under compute and callback spells); where "
                  f"each rank was 8x slow one step in ten, strategy=local_sgd (sync_every=32) reached 98 % "
                  f"{FAMILY_TRANSIENT['local_h32']:.2f}x sooner than DDP and strategy=delayed_averaging (delay=2) "
                  f"{FAMILY_TRANSIENT['dga_d2']:.2f}x (end to end) [{FAMILY_SOURCE}]"),
    "none": (f"strategy=ddp: without a straggler balanced, ssp and ssp_async ran at {_range('none/balanced,ssp,ssp_async')} "
             "of its time to accuracy"),
}


@dataclass
class RankTimes:
    """One rank's batches of an epoch: seconds of each whole cycle, of its backward and optimizer step
    (where ranks wait for each other), of the stop check before it (where ranks meet too: the per-batch
    meeting point, :mod:`lightning_hybrid.strategies.meeting`), and its samples."""

    cycle: list[float] = field(default_factory=list)
    sync: list[float] = field(default_factory=list)
    check: list[float] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    forward: list[float] = field(default_factory=list)

    def compute_s(self) -> float:
        """A batch's own compute, the exchange left out: its cycle less its backward and step, plus twice its
        forward (a backward's FLOPs are about twice the forward's); the median over the batches."""
        n = min(len(self.cycle), len(self.sync), len(self.forward))
        if not n:
            return 0.0
        return statistics.median(c - s + 2 * f for c, s, f in zip(self.cycle[:n], self.sync[:n], self.forward[:n]))


@dataclass
class StragglerFinding:
    """What :func:`analyse` found: per rank the mean cycle, wait and own seconds per batch; the slowest
    rank, its slowdown (own work per sample against the others' median), its pattern (``persistent``,
    ``transient`` or ``none``) and the share of its batches that were slow."""

    cycle_s: list[float]
    wait_s: list[float]
    own_s: list[float]
    slow_rank: int | None
    factor: float
    pattern: str
    slow_share: float

    def line(self, epoch: int) -> str:
        advice = ADVICE[self.pattern]
        if self.pattern == "none":
            return f"straggler report, epoch {epoch}: no rank is slower than the others (worst {self.factor:.2f}x); {advice}"
        return (f"straggler report, epoch {epoch}: rank {self.slow_rank} is {self.factor:.1f}x slower than the others "
                f"({self.pattern}: slow in {self.slow_share:.0%} of its batches; it waits "
                f"{self.wait_s[self.slow_rank]:.3f} s a batch, the others {_others(self.wait_s, self.slow_rank):.3f} s); "
                f"{advice} [{SOURCE}]")


def _others(values: list[float], rank: int) -> float:
    rest = [v for r, v in enumerate(values) if r != rank]
    return statistics.median(rest) if rest else 0.0


def analyse(ranks: list[RankTimes]) -> StragglerFinding:
    """Split every rank's cycles into own work and wait, and find the slowest rank (module docstring)."""
    typical_sync = [statistics.median(r.sync) if r.sync else 0.0 for r in ranks]
    base_sync = min(typical_sync)
    own_per_sample, waits, owns, cycles = [], [], [], []
    for r in ranks:
        checks = r.check if len(r.check) == len(r.sync) else [0.0] * len(r.sync)
        wait = [max(0.0, s - base_sync) + c for s, c in zip(r.sync, checks)]
        own = [c - w for c, w in zip(r.cycle, wait)]
        own_per_sample.append([o / max(n, 1) for o, n in zip(own, r.samples)])
        waits.append(statistics.fmean(wait) if wait else 0.0)
        owns.append(statistics.fmean(own) if own else 0.0)
        cycles.append(statistics.fmean(r.cycle) if r.cycle else 0.0)
    typical = [statistics.median(s) if s else 0.0 for s in own_per_sample]
    means = [statistics.fmean(s) if s else 0.0 for s in own_per_sample]
    slow = max(range(len(ranks)), key=lambda r: means[r])
    others = [typical[r] for r in range(len(ranks)) if r != slow]
    reference = statistics.median(others) if others else typical[slow]
    if reference <= 0 or len(ranks) < 2:
        return StragglerFinding(cycles, waits, owns, None, 1.0, "none", 0.0)
    slow_share = sum(s >= SLOW_FACTOR * reference for s in own_per_sample[slow]) / max(len(own_per_sample[slow]), 1)
    if slow_share >= PERSISTENT_SHARE:
        return StragglerFinding(cycles, waits, owns, slow, typical[slow] / reference, "persistent", slow_share)
    if slow_share >= TRANSIENT_SHARE and means[slow] >= TRANSIENT_FACTOR * reference:
        return StragglerFinding(cycles, waits, owns, slow, means[slow] / reference, "transient", slow_share)
    return StragglerFinding(cycles, waits, owns, None, means[slow] / reference, "none", slow_share)


@dataclass
class LinkRegime:
    """The link the ranks measured between them and the regime it makes with their compute."""

    round_trip_s: float
    bytes_per_s: float
    step_bytes: float
    regime: Regime

    def line(self) -> str:
        rate = "no measurable limit" if self.bytes_per_s == float("inf") else f"{self.bytes_per_s / 1e6:.1f} MB/s"
        r = self.regime
        return (f"{r.name}: a step computes {1000 * r.compute_s:.1f} ms; the link's round trip is "
                f"{1000 * self.round_trip_s:.1f} ms ({1000 * r.latency_s:.1f} ms of round trips a synchronous step), "
                f"its rate {rate} ({1000 * r.bandwidth_s:.1f} ms for the gradients' "
                f"{self.step_bytes / 1e6:.2f} MB); {r.advice} [lightning_hybrid.comm.regime]")
