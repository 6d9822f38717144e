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
import time
from typing import Any

import pytorch_lightning as pl
import torch.distributed as dist

from lightning_hybrid.comm.collectives import all_gather_object
from lightning_hybrid.comm.regime import classify, measure_link, restarts_slow_start_after_idle, round_trips, sent_bytes
from lightning_hybrid.say import say
from lightning_hybrid.strategies.agreements import EveryBatch
from lightning_hybrid.strategies.meeting import meeting
from lightning_hybrid.straggler_analysis import (  # noqa: F401  (plain: one object under both namespaces)
    ADVICE, MEASURED, PERSISTENT_SHARE, SLOW_FACTOR, SOURCE, TRANSIENT_FACTOR, TRANSIENT_SHARE, LinkRegime, RankTimes,
    StragglerFinding, analyse)

log = logging.getLogger(__name__)




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
                      round_trips=waits, exchange_round_trips=round_trips("all_reduce", ranks, numel),
                      idle_restart=bool(restarts_slow_start_after_idle()))
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
