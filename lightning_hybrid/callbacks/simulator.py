"""Simulated heterogeneity: slower ranks, transient stragglers, CPU contention and collective latency."""

from __future__ import annotations

import logging
import multiprocessing
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

import pytorch_lightning as pl
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from lightning_hybrid.strategies.parameter_server import ParameterServerStrategy
from lightning_hybrid.strategies.capabilities import capabilities_of

from lightning_hybrid.sim.contention import check_cores
from lightning_hybrid.sim.cpu_share import CpuShare
from lightning_hybrid.sim.latency import CollectiveLatency, latent_allreduce_hook
from lightning_hybrid.sim.slowdown import SlowBatches, StepStretcher, check_where

#: One log for the suite's callbacks (their lines read "lightning_hybrid.callbacks").
log = logging.getLogger("lightning_hybrid.callbacks")


#: The steps (after the fit's first) over which :class:`HeterogeneitySimulator` measures a rank's work
#: per sample for ``where="after_step"`` and ``"data"``.
CALIBRATION_STEPS = 5


class HeterogeneitySimulator(pl.Callback):
    """Lightning callback: rank ``i`` is ``slowdown[i]`` times slower, with the time put where ``where`` says.

    The rank's work in each training batch (forward, backward, optimizer step and the hooks around
    them, measured as the process's CPU time on CPU devices, as wall-clock time minus the time the
    strategy reports waiting on GPUs) is what a slowdown multiplies; the extra time is slept. (CPU
    time is the work when each process runs one torch thread, as the CLI sets on CPU with as many
    processes as cores; intra-op threads spinning while another process has the core add to it.)

    * ``where="compute"``: ``factor - 1`` times the step's work, inside the strategy where it times
      its compute, for strategies that can slow it themselves (``inject_compute_slowdown``:
      :class:`~lightning_hybrid.HybridParallelStrategy`, whose pipeline stages wait for each other
      within a step, and :class:`~lightning_hybrid.BalancedDataParallelStrategy`, right before its
      gradients' all-reduce); after the optimizer step for the others.
    * ``where="after_step"``: after the optimizer step (``on_train_batch_end``), for every strategy:
      what a heavy callback, logging, or a busier host looks like.
    * ``where="data"``: in the rank's training DataLoader (its collate function sleeps,
      :class:`~lightning_hybrid.sim.SlowBatches`): a slow disk or decoder.

    For ``after_step`` and ``data`` the sleep is ``factor - 1`` times the rank's work per sample,
    measured over its first steps (:data:`CALIBRATION_STEPS` after the first, at the shares the run
    starts with) and then fixed, times the batch's samples: the rank's cost per sample is ``factor``
    times its own whatever share of the data a strategy gives it, as a slow disk's would be.

    Waiting for other processes is not stretched: a slow device computes slowly, it does not wait
    longer. A strategy whose ranks wait for one another (DDP) slows to the slowest rank's pace,
    and one that lets ranks run ahead (SSP) does not: exactly the contrast the benchmarks measure.
    Real contention instead of sleeping: ``affinity`` pins ranks to cores that a
    :class:`~lightning_hybrid.sim.Competitor` process (started by the benchmark) keeps busy. Devices of
    different speeds that lend each other nothing: ``cpu_share`` gives each rank a share of the CPU's time
    (:class:`~lightning_hybrid.sim.cpu_share.CpuShare`); a sleeping rank lends its core to ranks sharing it,
    a rank at its share does not.

    Args:
        slowdown: one factor per rank (``len == world size``), each >= 1; ``None`` for none.
        straggle_prob: per-step (``where="data"``: per-batch) probability of a transient straggler, on every rank.
        straggle_factor: how much slower a straggler step is.
        seed: straggler draws use ``(seed, rank)``, so runs are reproducible.
        collective_latency_s: a simulated long link's round trip, seconds: every collective completes
            its message steps' round trips (gloo: two for an all-reduce of 2 ranks, one for a broadcast)
            later than its data, its caller not blocked meanwhile
            (:class:`~lightning_hybrid.sim.latency.CollectiveLatency`; DDP's buckets through a
            communication hook): what a long link does to DDP, local SGD and the delayed all-reduce,
            on one machine. The parameter-server strategies' point-to-point messages are not
            delayed: refused there.
        collective_in_flight: collectives of one process group whose latencies run at once, the rest
            waiting for one to complete; None: as many as the backend runs (gloo 2, NCCL 1); 0: unlimited.
        collective_bytes_per_s: the link's rate for a collective's messages (each also waits the bytes a
            rank sends in it over this rate); None: round trips alone.
        where: ``"compute"``, ``"after_step"`` or ``"data"`` (see above).
        affinity: one entry per rank: the CPU cores it is pinned to (``os.sched_setaffinity``), or
            ``None`` to leave it where it is; ``None`` for no pinning.
        cpu_share: one entry per rank: the cores' worth of CPU time it may use (``0.25``: a quarter of a core),
            or ``None`` for no limit; ``None`` for none. Needs a writable CPU cgroup (root).

    Example::

        >>> sim = HeterogeneitySimulator(slowdown=[1.0, 4.0])   # rank 1 is four times slower
        >>> # pl.Trainer(devices=2, strategy="ddp", callbacks=[sim])
        >>> sim = HeterogeneitySimulator(slowdown=[1.0, 4.0], where="data")  # rank 1's batches arrive 4x slower
    """

    def __init__(
        self,
        slowdown: Sequence[float] | None = None,
        straggle_prob: float = 0.0,
        straggle_factor: float = 3.0,
        seed: int = 0,
        collective_latency_s: float = 0.0,
        collective_in_flight: int | None = None,
        collective_bytes_per_s: float | None = None,
        where: str = "compute",
        affinity: Sequence[Sequence[int] | None] | None = None,
        cpu_share: Sequence[float | None] | None = None,
    ) -> None:
        if not collective_latency_s >= 0:
            raise ValueError(f"collective_latency_s must be non-negative seconds, got {collective_latency_s}")
        self.collective_latency_s = float(collective_latency_s)
        if collective_in_flight is not None and not collective_in_flight >= 0:
            raise ValueError(f"sim.collective_in_flight is a number of collectives (0: unlimited; null: the backend's), "
                             f"got {collective_in_flight}")
        self.collective_in_flight = collective_in_flight
        if collective_bytes_per_s is not None and not collective_bytes_per_s > 0:
            raise ValueError(f"sim.collective_bytes_per_s is a positive rate (null: round trips alone), "
                             f"got {collective_bytes_per_s}")
        self.collective_bytes_per_s = collective_bytes_per_s
        self.slowdown = None if slowdown is None else [float(f) for f in slowdown]
        self.straggle_prob = float(straggle_prob)
        self.straggle_factor = float(straggle_factor)
        self.seed = int(seed)
        self.where = check_where(where)
        self.affinity = None if affinity is None else [None if c is None else check_cores(c) for c in affinity]
        self.cpu_share = None if cpu_share is None else [None if c is None else float(c) for c in cpu_share]
        if any(c is not None and not c > 0 for c in self.cpu_share or []):
            raise ValueError(f"sim.cpu_share gives each rank a positive number of cores (or null), got {list(cpu_share)}")
        self._cpu_share: CpuShare | None = None
        # Validate every factor now, in the launching process, before workers are started.
        for factor in self.slowdown or [1.0]:
            StepStretcher(factor, self.straggle_prob, self.straggle_factor)
        #: This rank's slowdown and straggler draws: per step, or per batch of its DataLoader (``where="data"``);
        #: ``stretcher.slept`` is the time slept (in the training process).
        self.stretcher: StepStretcher | None = None
        self._per_sample_s: Any = None  # multiprocessing.Value: the rank's calibrated work per sample
        self._calibration: list[float] = []  # work per sample of the first measured steps
        self._work_clock: Any = time.process_time
        self._step_start: float | None = None
        self._strategy: Any = None
        self._latency: CollectiveLatency | None = None

    @property
    def active(self) -> bool:
        """Whether this simulator changes anything at all."""
        return (
            any(f != 1.0 for f in self.slowdown or [])
            or (self.straggle_prob > 0 and self.straggle_factor > 1)
            or self.collective_latency_s > 0
            or any(c is not None for c in self.affinity or [])
            or any(c is not None for c in self.cpu_share or [])
        )

    def check_world_size(self, world_size: int) -> None:
        """Raise a ValueError when ``slowdown`` or ``affinity`` does not give exactly one entry per rank, or a
        latency is asked of one process (it has nothing to send)."""
        if self.collective_latency_s > 0 and world_size < 2:
            raise ValueError(f"sim.collective_latency_s={self.collective_latency_s} delays what ranks send each other, "
                             "and this run has one process: set trainer.devices=2 (or more) and a strategy that "
                             "all-reduces (ddp, delayed_averaging, local_sgd), or sim.collective_latency_s=0")
        if self.slowdown is not None and len(self.slowdown) != world_size:
            raise ValueError(
                f"sim.slowdown has {len(self.slowdown)} factors {self.slowdown} but the run has {world_size} "
                f"training ranks; give one factor per rank, e.g. sim.slowdown=[{','.join(['1.0'] * world_size)}]"
            )
        if self.affinity is not None and len(self.affinity) != world_size:
            raise ValueError(
                f"sim.affinity has {len(self.affinity)} entries but the run has {world_size} training ranks; give one "
                f"per rank (a list of cores, or null to leave the rank unpinned), e.g. sim.affinity=[null,[1]]"
            )
        if self.cpu_share is not None and len(self.cpu_share) != world_size:
            raise ValueError(
                f"sim.cpu_share has {len(self.cpu_share)} entries but the run has {world_size} training ranks; give one "
                f"per rank (cores' worth of CPU time, or null for no limit), e.g. sim.cpu_share=[0.25,0.5]"
            )

    def check_strategy(self, strategy: Any) -> None:
        """Raise a ValueError when a collective latency is asked of a strategy whose messages it does not delay."""
        if self.collective_latency_s > 0 and isinstance(strategy, ParameterServerStrategy):
            raise ValueError(
                f"sim.collective_latency_s={self.collective_latency_s} delays collectives (all-reduces: DDP, local SGD, "
                f"the delayed all-reduce); {type(strategy).__name__}'s workers reach their server point to point, "
                "which it does not delay. Set sim.collective_latency_s=0, or measure a real link (benchmarks/slow_link.py)."
            )

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            # Inference: only a strategy that runs one input across ranks (partitioned inference) is slowed.
            if self.slowdown is not None and capabilities_of(trainer.strategy).slows_its_compute:
                self.check_world_size(trainer.world_size)
                trainer.strategy.inject_compute_slowdown(self.slowdown[trainer.global_rank])
            return
        self.check_world_size(trainer.world_size)
        self.check_strategy(trainer.strategy)
        if self.collective_latency_s > 0 and self._latency is None:
            self._latency = CollectiveLatency(self.collective_latency_s, self.collective_in_flight,
                                              self.collective_bytes_per_s).install()
            log.info("rank %d: simulated collective latency %.3f s", trainer.global_rank, self.collective_latency_s)
        rank = trainer.global_rank
        cores = self.affinity[rank] if self.affinity is not None else None
        if cores is not None:
            os.sched_setaffinity(0, cores)
            log.info("rank %d: pinned to CPU core(s) %s", rank, ",".join(map(str, cores)))
        share = self.cpu_share[rank] if self.cpu_share is not None else None
        if share is not None and self._cpu_share is None:
            self._cpu_share = CpuShare(share, f"rank{rank}").open()
            log.info("rank %d: %.3g cores' worth of CPU time (%s)", rank, share, self._cpu_share.group)
        on_cpu = trainer.strategy.root_device.type == "cpu"
        self._work_clock = time.process_time if on_cpu else self._wall_minus_waits(trainer)
        factor = self.slowdown[rank] if self.slowdown is not None else 1.0
        step_factor, applied_by = factor, "after each training step"
        if self.where == "compute" and capabilities_of(trainer.strategy).slows_its_compute:
            # Pipeline stages wait for one another inside a step, balanced DP times its compute: slow the compute itself.
            trainer.strategy.inject_compute_slowdown(factor)
            step_factor, applied_by = 1.0, f"{type(trainer.strategy).__name__}'s compute"
        self._per_sample_s, self._calibration = None, []
        if self.where != "compute":  # a per-sample cost, calibrated on the first steps
            self._per_sample_s = multiprocessing.get_context().Value("d", 0.0)
        if self.where == "data":
            applied_by = "its training DataLoader's batches"
            self._slow_the_training_dataloaders(trainer.strategy)
        self.stretcher = StepStretcher(step_factor, self.straggle_prob, self.straggle_factor, seed=(self.seed, rank))
        if self.active:
            log.info(
                "rank %d: simulated slowdown x%.2f (on %s), stragglers p=%.3f x%.2f",
                rank, factor, applied_by, self.straggle_prob, self.straggle_factor,
            )

    def _slow_the_training_dataloaders(self, strategy: Any) -> None:
        """Give every training DataLoader the strategy prepares the slow collate function (before
        Lightning iterates it; the strategy's own preparation, e.g. its sampler, stays)."""
        self._strategy = strategy
        prepare = type(strategy).process_dataloader.__get__(strategy)

        def process_dataloader(dataloader: Any) -> Any:
            dataloader = prepare(dataloader)
            trainer = strategy.lightning_module.trainer if strategy.lightning_module is not None else None
            if trainer is not None and trainer.training and isinstance(dataloader, DataLoader):
                collate = dataloader.collate_fn
                if isinstance(collate, SlowBatches):
                    collate = collate.collate_fn
                dataloader.collate_fn = SlowBatches(collate, self.stretcher, self._per_sample_s)
            return dataloader

        strategy.process_dataloader = process_dataloader

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """DDP's buckets reach the network from C++; with a latency, through a hook that the latency delays
        (a strategy that registered a hook of its own calls torch.distributed from it)."""
        model = trainer.strategy.model
        if self._latency is not None and isinstance(model, DistributedDataParallel) and not model._comm_hooks:
            model.register_comm_hook(model.process_group, latent_allreduce_hook)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._strategy is not None:
            vars(self._strategy).pop("process_dataloader", None)
            self._strategy = None
        if self._latency is not None and stage == "fit":
            self._latency.uninstall()
            self._latency = None
        if self._cpu_share is not None and stage == "fit":
            self._cpu_share.close()
            self._cpu_share = None

    @staticmethod
    def _wall_minus_waits(trainer: pl.Trainer) -> Any:
        def now() -> float:
            return time.perf_counter() - float(capabilities_of(trainer.strategy).communication_wait_s)

        return now

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        self._step_start = self._work_clock()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.stretcher is None or self._step_start is None:
            return
        work = max(0.0, self._work_clock() - self._step_start)
        self._step_start = None
        if self._per_sample_s is None:  # compute: this step's own work, stretched
            self.stretcher.stretch(work)
            return
        first = batch[0] if isinstance(batch, (list, tuple)) else batch
        samples = max(len(first) if hasattr(first, "__len__") else 1, 1)
        self._calibrate(work / samples)
        if self.where == "after_step":
            self.stretcher.stretch(samples * self._per_sample_s.value)

    def _calibrate(self, per_sample: float) -> None:
        """The rank's work per sample: the median of its first measured steps (the fit's first warms up)."""
        if len(self._calibration) > CALIBRATION_STEPS:
            return
        self._calibration.append(per_sample)
        measured = self._calibration[1:]
        if measured:
            self._per_sample_s.value = statistics.median(measured)
