# Generated from lightning_hybrid/strategies/parameter_server.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""ParameterServerStrategy: the Lightning glue shared by the parameter-server strategies.

Global rank 0 starts the server process (:mod:`lightning_hybrid.parameter_server.server`), every
worker joins the side channel to it, hands its optimizer over (worker 0), and at the global sync
points (the start and end of fitting, the end of every training epoch before validation and
checkpoints) waits for all workers and takes the server's parameters and optimizer state. What a
worker does between sync points is the subclass's: :class:`~lightning_hybrid.lightning.strategies.ssp.SSPStrategy`
pushes every step's gradient, :class:`~lightning_hybrid.lightning.strategies.cneural.CNeuralStrategy`
pushes one sum per pass. Lightning's collectives (validation, ``sync_dist`` logging, checkpoints,
early stopping) happen at the sync points; between them the workers drift apart.

The plain parts are the algorithm package's: the servers' options, settings, processes and clients
:mod:`~lightning_hybrid.parameter_server.server_launch`, the epoch's figures
:mod:`~lightning_hybrid.parameter_server.epoch_stats`, the survivors' group :mod:`lightning_hybrid.comm.regroup`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import signal
import subprocess
import time
from abc import abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import SIGTERMException
import torch
from lightning.pytorch.trainer.states import TrainerFn

from lightning_hybrid.comm.collectives import broadcast_
from lightning_hybrid.comm.flat import copy_into, flatten, gradients
from lightning_hybrid.comm.regroup import regroup_survivors
from lightning_hybrid.parameter_server import server_launch
from lightning_hybrid.parameter_server.channel import ChannelClosedError
from lightning_hybrid.parameter_server.client import ParameterServerClient, PullInfo, load_server_state
from lightning_hybrid.parameter_server.epoch_stats import (
    WorkerEpochStats, epoch_history, epoch_logs, gather_stats, new_counts, summarise,
)
from lightning_hybrid.parameter_server.hyperparameters import GroupLayout, GroupValues
from lightning_hybrid.parameter_server.load import ServerLoad
from lightning_hybrid.parameter_server.protocol import wire_dtype as wire_dtype_of
from lightning_hybrid.parameter_server.server_launch import SERVER_EXIT_S, TRANSPORTS
from lightning_hybrid.lightning.strategies.checked_ddp import CheckedDDPStrategy
from lightning_hybrid.lightning.strategies.refusals import refuse_grad_scaler, refuse_manual_optimization, refuse_mid_epoch_checkpoints, single_optimizer
from lightning_hybrid.strategies.replaced_step import ReplacedStep, unwrap_optimizer
from lightning_hybrid.strategies.clip_record import ClipRecord
from lightning_hybrid.strategies.forked_ranks import ForkedProcess, Standby
from lightning_hybrid.strategies.agreements import Agreement, EveryBatch, ThroughServer
from lightning_hybrid.lightning.strategies.meeting import meeting
from lightning_hybrid.lightning.strategies.step_count import restored_global_step

log = logging.getLogger(__name__)

__all__ = ["SERVER_EXIT_S", "TRANSPORTS", "ParameterServerStrategy", "WorkerEpochStats"]

_SESSIONS = itertools.count()


class ParameterServerStrategy(CheckedDDPStrategy):
    """Workers that train against a parameter-server process (see the module docstring).

    Subclasses set :attr:`staleness` and :attr:`sync` (the server's rule) and implement
    :meth:`_replaced_step` (what an optimizer step does instead of stepping). Lightning's world size
    counts workers only.

    Args:
        timeout: seconds a worker or the server waits for the other side before failing with an
            error (a dead or stalled worker ends the run instead of hanging it).
        process_group_backend: backend of the workers' own group (``None``: nccl with one worker per
            GPU, otherwise gloo); the server channel is always gloo with CPU tensors.
        on_worker_failure: what the death of a worker other than rank 0 does. ``"stop"`` (default):
            the run ends with a message naming it. ``"continue"``: the server deals the batches it
            held to the others and waits for it no more; at the epoch's synchronization the
            survivors form a new process group for Lightning's collectives (validation and test
            data re-split among them), and the run finishes with them. Rank 0, the server, or a
            death during validation or checkpointing (collectives among the workers) still end
            the run. Runs started by Lightning's launcher (``devices=N``); under torchrun or SLURM
            their launcher ends the run when a rank dies.
        processes_per_device: processes started on each device the Trainer gives (``devices=1,
            processes_per_device=2``: two processes on one GPU, whose group then uses gloo).
        transport: how gradients and parameters travel (:data:`TRANSPORTS`): ``"auto"`` (default)
            through a shared-memory segment for each worker on the server's host
            (:mod:`~lightning_hybrid.parameter_server.shared_memory`; one warning and the side
            channel where /dev/shm has no room; the side channel inside a shaped link,
            :mod:`lightning_hybrid.sim.link`, which shared memory would bypass), ``"channel"`` through
            the side channel always. The
            run does the same either way; :attr:`transport_used` says which this worker got.
        wire_dtype: ``"fp32"`` (default) or ``"bf16"``: the dtype gradients and parameters travel
            in, half the bytes with bf16; the server keeps float32 weights and optimizer state.
        servers: server processes, each holding a contiguous shard of the parameters (balanced
            by bytes) and doing its part of every push at once
            (:mod:`~lightning_hybrid.parameter_server.sharding`, which says what the shards agree
            on). ``"auto"`` (default): one per
            :data:`~lightning_hybrid.parameter_server.sharding.AUTO_MIN_PARAMS_PER_SHARD` parameters
            (one server below 8 M), no more than the cores the workers on rank 0's host leave free
            or two; one with ``on_worker_failure="continue"``. ``k``: ``k`` servers. Every shard is
            one more process beside the workers.
        server_device: where the server keeps the parameters and the optimizer's state and
            takes its steps: ``"cpu"`` (default), ``"cuda"`` / ``"cuda:N"``, or ``"auto"`` (the
            device of rank 0's model: a GPU when the workers train on GPUs). Gradients and
            parameters still travel through host memory (shared memory or the side channel);
            on a GPU the server's step costs far less than the copies, on the CPU it is the
            largest part of a push (``benchmarks/server_capacity.py``).
    """

    wraps_model = False  # no DDP wrapper (CheckedDDPStrategy.wraps_model)

    #: The fewest workers the strategy runs with.
    min_workers: ClassVar[int] = 2
    #: Epoch figures are logged as ``<metrics_prefix>/worker{rank}/<name>`` for these names.
    metrics_prefix: ClassVar[str] = "ps"
    logged_stats: ClassVar[tuple[str, ...]] = tuple(WorkerEpochStats.__dataclass_fields__)
    #: Each push is a sum over the worker's whole share of the data, one per pass (cNeural).
    batch_mode: ClassVar[bool] = False
    #: Whether a ``val_check_interval`` below an epoch works (see :meth:`check_val_check_interval`).
    validates_mid_epoch: ClassVar[bool] = False
    #: Why step- or time-interval checkpoints are refused, and what to use.
    mid_epoch_checkpoints_instead: ClassVar[str] = (
        "The workers' step counts differ, so no step N is global: use every_n_epochs, or val_check_interval (a global "
        "sync point with validation) with a ModelCheckpoint, which then saves after each validation."
    )
    #: A checkpoint between sync points cannot hold the run's state (see above), so a fit stopped by a
    #: signal resumes from its last epoch-end checkpoint and repeats the epoch (lightning_hybrid.lightning.preemption).
    resumes_mid_epoch: ClassVar[bool] = False

    def __init__(
        self,
        timeout: float = 300.0,
        on_worker_failure: str = "stop",
        transport: str = "auto",
        wire_dtype: str = "fp32",
        servers: int | str = "auto",
        server_device: str = "cpu",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        server_launch.check_options(timeout, on_worker_failure, transport, servers, server_device)
        self.servers = servers
        self.server_device = server_device
        self._wire_dtype = wire_dtype_of(wire_dtype)
        self.transport, self.wire_dtype = transport, wire_dtype
        #: How this worker's gradients and parameters travel in the current fit: "shared_memory" or "channel".
        self.transport_used: str | None = None
        self.on_worker_failure = on_worker_failure
        self.timeout = float(timeout)
        self.staleness: float = 0.0
        self.sync = "delay"
        self.client: ParameterServerClient | None = None
        self.history: list[list[WorkerEpochStats]] = []
        #: Seconds this worker has spent blocked on the server (the simulator does not stretch them).
        self.communication_wait_s = 0.0
        #: Global rank 0, after fitting: what the server did and how busy it was (its ``Bye``).
        self.server_load: ServerLoad | None = None
        self._servers: list[subprocess.Popen | ForkedProcess] = []  # the server processes, shard 0 first
        self._standby_server: Standby | None = None  # fork_ranks: the server process, forked at launch
        self._params: list[torch.Tensor] = []
        self._flat: torch.Tensor | None = None
        self._layout: GroupLayout | None = None  # the param groups' values that travel with each push
        self._clips: ClipRecord | None = None  # how Lightning clips each step: the server clips the average
        self._async = False
        self._failed = False  # the fit ended on an exception (teardown then meets no other worker)
        #: ``Trainer(max_steps=N)``: N optimizer steps of the server (the workers' own counts differ).
        self.max_steps = -1
        self._stop = False  # the server has taken max_steps steps
        self._steps_before = 0  # global_step of the checkpoint this fit resumed from
        self._weights_version = 0  # the server step of the parameters the model holds
        self._members: list[int] = []  # the workers not lost (on_worker_failure="continue")
        self._channel_prefix = ""
        self._reset_epoch_stats()

    @property
    def peer_timeout_s(self) -> float:
        """Seconds after which the server fails by itself when a worker stops talking to it
        (``timeout``): the watchdog reports a stalled worker before that (a worker's own waits for the
        server do not count as stalls: they have this timeout)."""
        return self.timeout

    @property
    def worker_loss_is_fatal(self) -> bool:
        return self.on_worker_failure != "continue"

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        """Evaluation data split among the workers left (all of them unless one was lost). Training
        data keeps the split of all workers: a lost worker's batches are dealt again (SSP), or its
        share is computed by its adopter (cNeural)."""
        members = self._members or list(range(self.num_workers))
        module = self.lightning_module
        training = module is not None and module._trainer is not None and module.trainer.training
        if training or self.global_rank not in members:
            return super().distributed_sampler_kwargs
        return {"num_replicas": len(members), "rank": members.index(self.global_rank)}

    @property
    def num_workers(self) -> int:
        return self.num_nodes * self.num_processes

    # ------------------------------------------------------------------ checks (before workers start)
    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        """Refuse what the strategy cannot run, with what to do instead."""
        name = type(self).__name__
        if self.num_workers < self.min_workers:
            raise ValueError(
                f"{name} needs at least {'two workers' if self.min_workers == 2 else f'{self.min_workers} worker'}, got "
                f"{self.num_workers}; set devices={max(self.min_workers, 2)} or more (CPU: each device is one worker process)."
            )
        refuse_manual_optimization(name, model, "the server runs the optimizer step")
        self.check_val_check_interval(trainer)
        refuse_mid_epoch_checkpoints(name, trainer, self.mid_epoch_checkpoints_instead)
        refuse_grad_scaler(name, self.precision_plugin)

    def check_val_check_interval(self, trainer: pl.Trainer) -> None:
        """Refuse a ``val_check_interval`` this strategy has no global point for: a time-based one
        (the workers reach a time at different batches), any mid-epoch one without
        :attr:`validates_mid_epoch`."""
        name = type(self).__name__
        if getattr(trainer, "_val_check_time_interval", None) is not None:
            raise ValueError(
                f"{name} validates where every worker meets, at a batch; a time-based val_check_interval has no such "
                "point (the workers reach a time at different batches). Give val_check_interval as a fraction of the "
                "epoch or a number of batches."
            )
        if trainer.val_check_interval != 1.0 and not self.validates_mid_epoch:
            raise ValueError(
                f"{name} validates at the end of each epoch only (a global sync point); got "
                f"val_check_interval={trainer.val_check_interval}. Use check_val_every_n_epoch instead."
            )

    # ------------------------------------------------------------------ setup
    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        self.check_trainer(trainer, self.lightning_module)
        optimizer = single_optimizer(type(self).__name__, self.optimizers)
        self._params = [p for group in optimizer.param_groups for p in group["params"]]
        self._flat = torch.empty(sum(p.numel() for p in self._params), dtype=torch.float32)
        # The server counts the steps: each worker's Lightning loop must not stop at its own count.
        self.max_steps, trainer.fit_loop.epoch_loop.max_steps = trainer.max_steps, -1
        self._steps_before = restored_global_step(trainer)  # a resumed run's server counts the steps left
        self._stop = False
        self._members = list(range(self.num_workers))
        self._clips = ClipRecord(self.precision_plugin, clips=False)  # the server clips the average, as DDP does
        self._open_server_channel()
        self.attach_sync_points(trainer)

    def stop_agreement(self, trainer: pl.Trainer) -> Agreement:
        """A worker asked to stop tells the server, and every worker stops at its next exchange with it:
        agreeing before each batch would be a collective that locks the workers into step with each other."""
        if trainer.state.fn != TrainerFn.FITTING:
            return EveryBatch()
        return ThroughServer(lambda signum: self.client.stop_run(signum))

    def _stopped_by_a_peer(self, signum: int) -> None:
        """A reply of the server says a worker stopped the run: stop here too (it does not return)."""
        meeting(self.lightning_module.trainer).stop_now(signum)

    def _open_server_channel(self) -> None:
        """Rank 0 starts the servers (:mod:`~lightning_hybrid.parameter_server.server_launch`), every worker connects."""
        env = self.cluster_environment
        self._channel_prefix = f"lightning_hybrid/ps/{next(_SESSIONS)}/"
        servers = server_launch.server_count(self.servers, self.on_worker_failure, self._flat.numel(), self.num_processes,
                                             self.global_rank)
        plan, shards = server_launch.shard_settings(
            [p.numel() for p in self._params], servers, self._channel_prefix,
            host=str(env.main_address), port=int(env.main_port), workers=self.num_workers, staleness=self.staleness,
            sync=self.sync, timeout=self.timeout, on_worker_failure=self.on_worker_failure, batch_mode=self.batch_mode,
            max_steps=max(self.max_steps - self._steps_before, 1) if self.max_steps > 0 else -1, wire_dtype=self.wire_dtype,
            server_device=server_launch.resolve_server_device(self.server_device, self.root_device), **self._update_rule(),
        )
        if self.global_rank == 0:
            standby, self._standby_server = self._standby_server, None
            self._servers = server_launch.start_servers(shards, standby.start if standby is not None else None)
            if self.rank_exit_watch is not None:
                for settings, process in zip(shards, self._servers):
                    self.rank_exit_watch.add(settings.name, None, process)
        self.client = server_launch.connect(shards, plan, self.global_rank, self.num_workers, self.timeout, self._wire_dtype)
        self.client.on_run_stopped = self._stopped_by_a_peer
        self.transport_used = server_launch.attach_transport(self.client, self.transport, self._flat.numel(),
                                                             announce=self.global_rank == 0)

    def on_ranks_forked(self) -> None:
        """With ``fork_ranks``, the server process is forked now too (no import of torch when fit starts)."""
        if self.cluster_environment.node_rank() == 0:
            self._standby_server = Standby(server_launch.serve)

    def _update_rule(self) -> dict[str, Any]:
        """The server's update rule settings (``ServerSettings`` fields) for staleness > 0."""
        return {}

    def _note(self, info: PullInfo) -> PullInfo:
        """Remember what a reply with parameters says: their server step, and whether the server
        stopped the run (max_steps)."""
        self._stop |= info.stop
        self._weights_version = info.version
        return info

    def _regroup_without_lost(self, info: PullInfo) -> None:
        """At a global sync: if the server has lost workers since the last one, form the survivors'
        process group (Lightning's collectives from here on) and re-split the evaluation data."""
        env = self.cluster_environment
        members = regroup_survivors(self._members, info.live, self.global_rank, str(env.main_address),
                                    int(env.main_port), self._channel_prefix, self.timeout)
        if members == self._members:
            return
        lost = sorted(set(self._members) - set(members))
        self._members = members
        log.warning(
            "worker rank %d: continuing without worker(s) %s (on_worker_failure='continue'); %d workers left: %s",
            self.global_rank, ", ".join(map(str, lost)), len(members), ", ".join(map(str, members)),
        )
        trainer = self.lightning_module.trainer
        for loop in (trainer.fit_loop.epoch_loop.val_loop, trainer.validate_loop, trainer.test_loop):
            loop._combined_loader = None  # rebuilt with the new split when next needed

    def on_sync_start(self, trainer: pl.Trainer) -> None:
        # The optimizer as worker 0 hands it over (a resumed fit's restored): its groups' numbers travel with each push.
        self._layout = GroupLayout.of(self.optimizers[0].param_groups)
        if self.global_rank == 0:
            self.client.init(self.optimizers[0])
        super().barrier("ps-init")
        self._pull_at_sync()

    # ------------------------------------------------------------------ the training step
    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        if self.client is None:
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        step = ReplacedStep(unwrap_optimizer(optimizer), self._replaced_step)
        return self.precision_plugin.optimizer_step(step, model=model or self.lightning_module, closure=closure, **kwargs)

    @abstractmethod
    def _replaced_step(self, optimizer: torch.optim.Optimizer) -> None:
        """What an optimizer step does instead of stepping (the gradients are in ``.grad``; Lightning's
        clip is recorded, not applied: :attr:`_clips`)."""

    def _hyperparameters(self, optimizer: torch.optim.Optimizer) -> GroupValues:
        """Every number of the optimizer's param groups now, as the server's step takes them (whatever the
        schedulers changed: learning rate, momentum, betas, weight decay)."""
        return self._layout.group_values(optimizer.param_groups)

    def _flat_grad(self) -> torch.Tensor:
        return flatten(gradients(self._params), dtype=torch.float32, device="cpu")

    def _load_flat(self) -> None:
        copy_into(self._flat, self._params)

    def _timed(self, request: Callable[[], Any]) -> Any:
        """Run a blocking request to the server, counting the time as waiting."""
        start = time.perf_counter()
        result = request()
        waited = time.perf_counter() - start
        self.communication_wait_s += waited
        self._epoch["wait_s"] += waited
        return result

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.client is not None:
            if not self._async:  # the epoch's first batch (on_train_epoch_start is skipped on some restarts)
                self._begin_async_phase()
            first = batch[0] if isinstance(batch, (list, tuple)) else batch
            self._count_samples(len(first) if hasattr(first, "__len__") else 1)
        super().on_train_batch_start(batch, batch_idx)

    def _count_samples(self, samples: int) -> None:
        self._epoch["samples"] += samples

    # ------------------------------------------------------------------ sync points
    def _reset_epoch_stats(self) -> None:
        self._epoch: dict[str, float] = new_counts()
        self._epoch_start = time.perf_counter()

    def _begin_async_phase(self) -> None:
        self._reset_epoch_stats()
        self._async = True

    def sync_point(self) -> None:
        """End of this worker's epoch: wait for all workers, take the server's parameters (idempotent)."""
        if not self._async or self.client is None:
            return
        self._epoch["train_s"] = time.perf_counter() - self._epoch_start
        self._before_sync()
        self._pull_at_sync()
        self._async = False
        if self._stop:  # max_steps: the server has taken its steps
            self.lightning_module.trainer.should_stop = True

    def _before_sync(self) -> None:
        """What a worker sends the server at the end of its epoch, before the global sync."""

    def _pull_at_sync(self) -> None:
        info = self._note(self.client.finish(self._flat))
        self._regroup_without_lost(info)
        self._load_flat()
        for buffer in self.lightning_module.buffers():
            broadcast_(buffer, src=0)
        if self.global_rank == 0:  # the server's optimizer state, so that checkpoints written now hold it
            load_server_state(self.optimizers[0], self.client.optimizer_state())

    def after_epoch_sync(self, pl_module: pl.LightningModule) -> None:
        """Gather every worker's figures of the epoch; log them as ``<prefix>/worker{rank}/...``."""
        gathered = gather_stats(summarise(self._epoch), self._members)
        self.history.append(epoch_history(gathered, self.num_workers))  # a lost worker's: zeros, not logged
        # Every worker logs the same gathered values (sync_dist averages identical numbers: no warning).
        for name, value in epoch_logs(gathered, self.num_workers, self.logged_stats, self.metrics_prefix).items():
            pl_module.log(name, value, on_step=False, on_epoch=True, sync_dist=True)

    def on_sync_end(self) -> None:
        if self.client is None:
            return
        self.sync_point()
        super().barrier("ps-end")  # every worker is done with the server
        if self.global_rank == 0:
            self.server_load = self._stop_server(self.client.shutdown)
            if self.server_load is not None:
                log.info("parameter server: %s", self.server_load.describe())
        # The others leave only now: a worker whose connection closes while the server still serves
        # reads to the server as a worker that died.
        super().barrier("ps-ended")
        self.client = None

    def on_exception(self, exception: BaseException) -> None:
        """An orderly stop (a signal): every worker tells the server it stops and leaves (the others
        learn it at their next exchange with the server); the server exits once all have, and rank 0,
        which started it, waits for that."""
        self._failed = True  # no more collectives at teardown
        if isinstance(exception, SIGTERMException) and self.client is not None:
            module = self.lightning_module
            signum = meeting(module.trainer).agreed if module is not None and module._trainer is not None else 0
            with contextlib.suppress(ChannelClosedError, RuntimeError):
                self.client.stop_run(signum or signal.SIGTERM)
                self.client.leave()
            self._stop_server(lambda: None, patience_s=SERVER_EXIT_S)
        super().on_exception(exception)

    def _stop_server(self, ask_to_end: Callable[[], Any], patience_s: float = 30.0) -> Any:
        """End the server (every shard) on purpose (:func:`~lightning_hybrid.parameter_server.server_launch.stop_servers`);
        what ``ask_to_end()`` returned."""
        forget = self.rank_exit_watch.forget if self.rank_exit_watch is not None else None
        answer = server_launch.stop_servers(self._servers, ask_to_end, patience_s, forget)  # ask_to_end may read _servers
        self._servers = []
        return answer

    # ------------------------------------------------------------------ Lightning's collectives
    def _workers_meet(self) -> bool:
        """Whether every worker reaches Lightning's collectives now (not: between sync points)."""
        return not self._async

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        if not self._workers_meet():
            # Between sync points the workers are at different steps: there is no collective every
            # worker reaches, and a reduction that silently stayed local would log a wrong number.
            raise RuntimeError(
                f"{type(self).__name__}: a reduction across workers was asked for during a training epoch, most likely "
                "`self.log(..., on_step=True, sync_dist=True)` in training_step. The workers are at different steps "
                "between the epoch's sync points, so nothing can be reduced there. Log the value with on_step=False "
                "(epoch-level values are reduced at the epoch's global sync) or with sync_dist=False (each worker "
                "logs its own)."
            )
        return super().reduce(tensor, group=group, reduce_op=reduce_op)

    def barrier(self, name: str | None = None) -> None:
        if self._workers_meet():
            super().barrier(name)

    def teardown(self) -> None:
        module = self.lightning_module
        if self._own_callback is not None and module is not None and module._trainer is not None:
            module.trainer.fit_loop.epoch_loop.max_steps = self.max_steps
        if self.client is not None and not self._failed:
            # A fit that ended without its last sync (one resumed after its last epoch: Lightning skips the
            # loop, but a worker may still be fetching its first batch from the server): every worker is
            # done with the server before it goes.
            self.barrier("ps-teardown")
        if any(process.poll() is None for process in self._servers):
            self._stop_server(lambda: [process.kill() for process in self._servers if process.poll() is None])
        self.client = None
        self._async = self._failed = False
        if self._clips is not None:  # Lightning clips on the worker again (another fit, another strategy's)
            self._clips.clips, self._clips = True, None
        super().teardown()
