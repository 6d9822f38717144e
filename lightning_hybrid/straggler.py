"""Which rank is slow, by how much, and what to do about it: the straggler report.

    trainer = pl.Trainer(strategy="ddp", devices=2, callbacks=[StragglerReport()])   # the CLI adds it

:class:`StragglerReport` times every training batch on every rank: its whole cycle (from one batch's
start to the next one's: loading, forward, backward, optimizer step, callbacks) and the part of it
spent in backward and the optimizer step, where ranks that meet every step wait for each other (DDP's
all-reduce, the balanced and delayed all-reduce strategies' exchange, the parameter server's push and
pull). At each epoch's end the ranks' timings are gathered and :func:`analyse` splits each rank's
cycle into its own work and its wait: a rank's wait is its backward-and-step time less the fastest
rank's typical one (the rank that arrives last waits least), its own work the rest. Per sample, the
slowest rank's own work against the others' median is its slowdown; a rank slow in most batches is a
persistent straggler, in a few (spells) a transient one. Logged per rank (``straggler/rank{r}/cycle_s``,
``wait_s``, ``own_s``: means per batch) and said in one line per epoch, with the strategy the suite's
measurements favour for that case (:data:`ADVICE`, from paper 000's recipe grid).

Once a fit, at its first epoch's end, the ranks also measure the link between them (a one-value
all-reduce: its round trip; one of the gradients' size: its rate) and the report says which regime the
run is in, compute-, latency- or bandwidth-bound, with what fits it and the bound on what overlapping the
exchange can win (:mod:`lightning_hybrid.comm.regime`).

Not measured: waits inside the forward pass (the pipeline's schedule runs whole in ``training_step``,
so under ``hybrid`` its bubbles count as the stages' own work).
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import pytorch_lightning as pl
import torch.distributed as dist

from lightning_hybrid.comm.collectives import all_gather_object
from lightning_hybrid.comm.regime import Regime, classify, measure_link, round_trips, sent_bytes
from lightning_hybrid.say import say
from lightning_hybrid.strategies.meeting import EveryBatch, meeting

log = logging.getLogger(__name__)


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
#: ``tests/test_numbers.py`` recomputes each from SOURCE's table.
MEASURED = {
    "persistent/balanced": (1.55, 2.26),
    "persistent/ssp": (1.48, 1.84),
    "transient/balanced,ssp,ssp_async": (0.86, 1.24),
    "transient/ssp_async/compute,after_step": (1.11, 1.18),
    "none/balanced,ssp,ssp_async": (1.01, 1.10),
}

#: Transient stragglers in the slow-link table (each rank 8x slower with probability 0.1 a step; LeNet-5 to 98 %,
#: 2 ranks, medians of 3 seeds): DDP's time over the contender's, computed (samples over throughput). ``tests/test_numbers.py`` reads them there.
FAMILY_SOURCE = "docs/strategies/allreduce-asgd.md, 'Time to 98 % under each source, computed'"
FAMILY_TRANSIENT = {"local_h32": 1.97, "dga_d2": 1.17}


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
                  f"{FAMILY_TRANSIENT['local_h32']:.2f}x sooner than DDP and strategy=allreduce_asgd (delay=2) "
                  f"{FAMILY_TRANSIENT['dga_d2']:.2f}x (computed: samples over throughput) [{FAMILY_SOURCE}]"),
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


def link_regime(trainer: pl.Trainer, pl_module: pl.LightningModule, compute_s: float) -> LinkRegime:
    """Measure the link (every rank calls this) and classify a step of ``compute_s`` on it: a synchronous
    step waits for its gradients' all-reduce and, where the ranks agree on a stop before every batch, that
    agreement's one-value all-reduce."""
    numel = sum(p.numel() for p in pl_module.parameters() if p.requires_grad)
    round_trip, rate = measure_link(numel, pl_module.device)
    ranks = trainer.world_size
    waits = round_trips("all_reduce", ranks, numel)
    if isinstance(meeting(trainer).agreement, EveryBatch):
        waits += round_trips("all_reduce", ranks, 1)
    step_bytes = sent_bytes("all_reduce", ranks, 4 * numel)
    regime = classify(max(compute_s, 1e-6), round_trip, step_bytes, rate if rate != float("inf") else 1e18,
                      round_trips=waits, exchange_round_trips=round_trips("all_reduce", ranks, numel))
    return LinkRegime(round_trip, rate, step_bytes, regime)


def _batch_size(batch: Any) -> int:
    first = batch[0] if isinstance(batch, (list, tuple)) and batch else batch
    return int(first.shape[0]) if hasattr(first, "shape") and len(first.shape) else 1


class StragglerReport(pl.Callback):
    """Per-rank cycle, wait and own time of every training batch, and one line per epoch naming the
    slow rank, its slowdown, its pattern and the strategy to pick (see the module docstring)."""

    def __init__(self) -> None:
        self.times = RankTimes()
        #: Each epoch's finding, in order (every rank has them).
        self.findings: list[StragglerFinding] = []
        self._before_backward: float | None = None
        self._last_start: float | None = None
        self._samples = 0
        self._check_s = 0.0
        #: The run's regime (compute-, latency- or bandwidth-bound), measured at the first epoch's end.
        self.regime: LinkRegime | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # First among the callbacks: a callback's work after a batch counts in the rank's cycle.
        if self in trainer.callbacks:
            trainer.callbacks.remove(self)
            trainer.callbacks.insert(0, self)
        if stage == "fit":  # the per-batch meeting point, where ranks that meet every step wait too
            meeting(trainer).attach().observe(self._record_check)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.times, self._last_start = RankTimes(), None

    def _record_check(self, seconds: float) -> None:
        self._check_s += seconds

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._last_start is not None and self._before_backward is not None:
            self.times.cycle.append(now - self._last_start)
            self.times.check.append(self._check_s)  # the check between the last batch and this one
        self._check_s = 0.0
        self._last_start, self._before_backward = now, None
        self._samples = _batch_size(batch)

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any) -> None:
        self._before_backward = time.perf_counter()
        if self._last_start is not None:
            self.times.forward.append(self._before_backward - self._last_start)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._before_backward is not None:
            self.times.sync.append(time.perf_counter() - self._before_backward)
            self.times.samples.append(self._samples)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.world_size < 2 or not (dist.is_available() and dist.is_initialized()):
            return  # one rank: nobody to be slower than
        times = self.times
        n = len(times.cycle)
        times.sync, times.samples, times.check = times.sync[:n], times.samples[:n], times.check[:n]
        ranks = all_gather_object(times)  # every rank, even one without a timed batch this epoch
        if not all(r.cycle for r in ranks):
            return
        if self.regime is None:  # once a fit: the link between the ranks against their compute
            self.regime = link_regime(trainer, pl_module, max(r.compute_s() for r in ranks))
            if trainer.is_global_zero:
                say(log, f"straggler report: {self.regime.line()}")
        finding = analyse(ranks)
        self.findings.append(finding)
        for rank, (cycle, wait, own) in enumerate(zip(finding.cycle_s, finding.wait_s, finding.own_s)):
            for name, value in (("cycle_s", cycle), ("wait_s", wait), ("own_s", own)):
                # The same gathered values on every rank: a max over ranks changes nothing and spares
                # Lightning's "use sync_dist=True" warning for each of them.
                pl_module.log(f"straggler/rank{rank}/{name}", value, on_epoch=True, sync_dist=True, reduce_fx="max")
        if trainer.is_global_zero:  # said in a plain script too, where nothing configured logging
            say(log, finding.line(trainer.current_epoch + 1))  # counted from 1, as the progress line

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        meeting(trainer).forget(self._record_check)
