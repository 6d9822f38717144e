"""SSPStrategy: data parallelism with a parameter server and bounded staleness (Lightning glue).

The algorithms live in :mod:`lightning_hybrid.comm`; this module wires them into Lightning:
it starts the server process, hands the user's optimizer to it, replaces the training sampler by
one that asks the server for batches, turns each optimizer step into a push of the gradient and
a pull of the newest parameters, and puts every collective Lightning does (validation, logging
with ``sync_dist``, checkpointing, early stopping) at a global synchronization point.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import pytorch_lightning as pl
import torch
from lightning_fabric.strategies import _StrategyRegistry
from pytorch_lightning.trainer.states import RunningStage, TrainerFn
from pytorch_lightning.utilities.data import _update_dataloader
from pytorch_lightning.utilities.exceptions import SIGTERMException
from pytorch_lightning.utilities.rank_zero import rank_zero_warn
from torch.utils.data import DataLoader, Sampler

from lightning_hybrid.comm.channel import open_channel
from lightning_hybrid.comm.collectives import all_gather, broadcast_
from lightning_hybrid.comm.sync_controller import validate_staleness
from lightning_hybrid.comm.worker_client import DatasetShape, ParameterServerClient
from lightning_hybrid.strategies.common import (
    ReplacedStep,
    UnwrappedDDPStrategy,
    refuse_grad_scaler,
    refuse_manual_optimization,
    refuse_mid_epoch_checkpoints,
    unwrap_optimizer,
)

log = logging.getLogger(__name__)

_SESSIONS = itertools.count()


class ServerSampler(Sampler[int]):
    """Training sampler of an SSP worker: its batches of indices come from the parameter server.

    The server deals the epoch's shuffled indices in batch-sized chunks to whichever worker asks
    (the next one rides along with the parameters a push returns), so a fast worker trains on more
    batches and the epoch still covers every sample once. It has no length: how many batches this
    worker gets is decided while the epoch runs.
    """

    def __init__(self, strategy: SSPStrategy) -> None:
        self.strategy = strategy

    def __iter__(self) -> Iterator[int]:
        # The epoch is read from the fit loop, not from set_epoch: when Lightning resumes from an
        # end-of-epoch checkpoint it starts iterating the next epoch before calling set_epoch.
        epoch = self.strategy.lightning_module.trainer.fit_loop.epoch_progress.current.processed
        self.strategy._start_data_epoch(epoch)
        while (chunk := self.strategy._next_chunk(epoch)) is not None:
            yield from chunk.tolist()


@dataclass
class WorkerEpochStats:
    """One worker's figures for one epoch (logged as ``ssp/worker{rank}/...``)."""

    iterations: int = 0
    samples: int = 0
    staleness_mean: float = 0.0
    staleness_max: int = 0
    wait_s: float = 0.0
    train_s: float = 0.0
    max_gap: int = 0
    samples_per_s: float = 0.0


class SSPStrategy(UnwrappedDDPStrategy):
    """Stale-synchronous or delay-synchronous data parallelism with a parameter server.

    One worker process per device trains on batches the server hands out; after each optimizer
    step it pushes its gradient and pulls the newest parameters, waiting only as much as the
    staleness bound demands. The server (a separate process started by global rank 0, joined
    through the run's usual rendezvous, CPU tensors over gloo) holds the authoritative parameters
    and runs the user's optimizer. Lightning's world size counts workers only.

    Args:
        staleness: how many iterations the fastest worker may be ahead of the slowest. ``0`` is
            bulk-synchronous (one averaged update per round: the same as DDP); ``float("inf")`` is
            fully asynchronous.
        sync: ``"delay"`` (Zhang et al. 2017): once the fastest is ``staleness`` ahead, everyone
            finishes its iteration, all workers get the same parameters, and counting restarts.
            ``"bounded"`` (Ho et al. 2013, SSP): a worker may start its next iteration while it is at
            most ``staleness`` ahead of the slowest; no reset.
        timeout: seconds a worker or the server waits for the other side before failing with an
            error (a dead or stalled worker ends the run instead of hanging it).
        process_group_backend: backend of the workers' own group (``None``: nccl with one worker per
            GPU, otherwise gloo); the server channel is always gloo with CPU tensors.
        processes_per_device: processes started on each device the Trainer gives (``devices=1,
            processes_per_device=2``: two processes on one GPU, whose group then uses gloo).
        batch_mode: cNeural's batch-mode master-worker training (Gu et al. 2013, paper 002) instead
            of per-step pushes: each worker trains through its own share of the data (Lightning's
            distributed sampler, or the resident shards of
            :class:`~lightning_hybrid.data.ShardDataModule`) without talking to the server, summing
            every mini-batch's gradient times its sample count; at the end of the pass (the
            epoch) each pushes that sum once, the server applies the mean over all samples of all
            workers in one optimizer step and every worker gets the new parameters. ``staleness``
            and ``sync`` do not apply (the pass is one bulk-synchronous round); one worker is
            allowed. The paper's update adds the summed changes with a learning rate; that is
            this step with the learning rate times the training-set size. Per-epoch checkpoints
            (``ModelCheckpoint(every_n_epochs=1, save_last=True)``) plus ``fit(ckpt_path="last")``
            give its crash recovery: rerunning the job resumes from the last completed pass.
            Learning-rate schedulers should use ``interval: epoch`` (one update per pass; a
            ``step`` interval advances per mini-batch).

    Semantics to know:

    * Sync points: the end of every training epoch (before validation), the start and end of
      fitting. Validation, checkpoints, early stopping and epoch-level ``sync_dist`` logging happen
      there. Between them, step-level ``sync_dist`` reductions stay local to the worker (warned once).
    * The learning-rate schedulers run on each worker as usual and the server applies the pushing
      worker's current learning rates; the optimizer state (momentum, Adam moments) is the server's
      and lands in checkpoints at each sync point. Resuming from such a checkpoint continues the run.
    * Not supported (a clear error before workers start): manual optimization, several
      optimizers, ``max_steps``, mid-epoch validation (``val_check_interval`` other than 1.0),
      step- or time-based checkpointing, fractional ``limit_train_batches``, fp16 with a gradient
      scaler, fewer than two workers.
    * BatchNorm-style buffers stay per worker during an epoch and are broadcast from worker 0 at
      the epoch's synchronization.

    Example::

        >>> import pytorch_lightning as pl
        >>> from lightning_hybrid import SSPStrategy
        >>> trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=SSPStrategy(staleness=3))
        >>> # trainer.fit(model, datamodule)        or: pl.Trainer(strategy="ssp", devices=4)
        >>> cneural = SSPStrategy(batch_mode=True)  # one full-batch update per pass; alias "cneural"
    """

    strategy_name = "ssp"

    def __init__(
        self,
        staleness: float | int = 3,
        sync: str = "delay",
        timeout: float = 300.0,
        accelerator: Any = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: Any = None,
        checkpoint_io: Any = None,
        precision_plugin: Any = None,
        process_group_backend: str | None = None,
        processes_per_device: int = 1,
        batch_mode: bool = False,
    ) -> None:
        super().__init__(
            accelerator, parallel_devices, cluster_environment, checkpoint_io, precision_plugin, process_group_backend,
            processes_per_device,
        )
        self.batch_mode = bool(batch_mode)
        self.staleness = validate_staleness(staleness, sync)
        self.sync = sync
        if self.batch_mode:  # the server collects one push per worker per pass: a bulk-synchronous round
            self.staleness, self.sync = 0.0, "delay"
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        self.timeout = float(timeout)
        self.client: ParameterServerClient | None = None
        self.history: list[list[WorkerEpochStats]] = []
        #: Seconds this worker has spent blocked on the server (the simulator does not stretch them).
        self.communication_wait_s = 0.0
        self._server: subprocess.Popen | None = None
        self._params: list[torch.Tensor] = []
        self._flat: torch.Tensor | None = None
        self.dataset_shape: DatasetShape | None = None
        # Batches the server sent along with parameters, not yet handed to the DataLoader.
        self._dealt: deque[torch.Tensor] = deque()
        self._dealt_epoch: int | None = None
        self._data_epoch_over = False
        self._async = False
        self._limit_train_batches: int | float = 1.0
        self._warned_local_reduce = False
        # Batch mode: this pass's gradient sum (each mini-batch's gradient times its sample count).
        self._pass_grad: torch.Tensor | None = None
        self._pass_samples = 0
        self._step_samples = 0  # samples of the mini-batches since the last optimizer step
        self._reset_epoch_stats()

    # ------------------------------------------------------------------ launching and checks
    @property
    def num_workers(self) -> int:
        return self.num_nodes * self.num_processes

    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        """Refuse what SSP cannot run, with what to do instead (called before workers start)."""
        if self.num_workers < (1 if self.batch_mode else 2):
            raise ValueError(
                f"SSPStrategy needs at least two workers, got {self.num_workers}; set devices=2 or more "
                "(CPU: each device is one worker process)."
            )
        refuse_manual_optimization("SSPStrategy", model, "the server runs the optimizer step")
        if trainer.max_steps != -1:
            raise ValueError(
                f"SSPStrategy does not support max_steps={trainer.max_steps}: workers run different numbers of "
                "steps. Bound the run with max_epochs (and limit_train_batches) instead."
            )
        if trainer.val_check_interval != 1.0:
            raise ValueError(
                f"SSPStrategy validates at the end of each epoch only (a global sync point); got "
                f"val_check_interval={trainer.val_check_interval}. Use check_val_every_n_epoch instead."
            )
        limit = trainer.limit_train_batches
        if isinstance(limit, float) and limit != 1.0 and not self.batch_mode:
            raise ValueError(
                f"SSPStrategy supports limit_train_batches as an integer (batches per worker, pooled) or 1.0, got {limit}"
            )
        refuse_mid_epoch_checkpoints("SSPStrategy", trainer)
        refuse_grad_scaler("SSPStrategy", self.precision_plugin)

    # ------------------------------------------------------------------ model and optimizer
    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        self.check_trainer(trainer, self.lightning_module)
        if len(self.optimizers) != 1:
            raise ValueError(f"SSPStrategy supports exactly one optimizer, configure_optimizers returned {len(self.optimizers)}")
        self._params = [p for group in self.optimizers[0].param_groups for p in group["params"]]
        self._flat = torch.empty(sum(p.numel() for p in self._params), dtype=torch.float32)
        self._open_server_channel()
        self.attach_sync_points(trainer)
        self._make_sigterm_check_local(trainer)
        if self.batch_mode:  # every worker iterates its own data; Lightning's limits apply as usual
            return
        # The server decides how many batches each worker gets; an integer limit_train_batches caps the
        # epoch's total (limit x workers) there. Lightning must see the epoch as of unknown length, so
        # that it ends, and validates, when the server's data runs out.
        self._limit_train_batches = trainer.limit_train_batches
        trainer.limit_train_batches = 1.0

    @staticmethod
    def _make_sigterm_check_local(trainer: pl.Trainer) -> None:
        """Lightning 2.6 broadcasts a SIGTERM flag from rank 0 after every training batch: a collective
        that would lock the workers into step with each other. Under SSP each worker checks its own
        flag instead; the others stop when the server channel closes."""
        epoch_loop = trainer.fit_loop.epoch_loop
        if not hasattr(epoch_loop, "_broadcast_sigterm_tensor"):
            return

        def check_local_sigterm() -> None:
            if getattr(trainer, "received_sigterm", False):
                raise SIGTERMException()

        epoch_loop._broadcast_sigterm_tensor = check_local_sigterm

    def _open_server_channel(self) -> None:
        env = self.cluster_environment
        host, port = env.main_address, env.main_port
        prefix = f"lightning_hybrid/ssp/{next(_SESSIONS)}/"
        if self.global_rank == 0:
            command = [
                sys.executable, "-m", "lightning_hybrid.comm.parameter_server", "--host", str(host), "--port", str(port),
                "--prefix", prefix, "--workers", str(self.num_workers), "--timeout", str(self.timeout),
                "--staleness", str(self.staleness), "--sync", self.sync,
            ]
            self._server = subprocess.Popen(command)
        pg = open_channel(host, port, prefix, self.global_rank + 1, self.num_workers + 1, self.timeout)
        self.client = ParameterServerClient(pg, self.global_rank)

    def process_dataloader(self, dataloader: object) -> object:
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if (
            self.client is None or self.batch_mode or trainer is None or not trainer.training
            or not isinstance(dataloader, DataLoader)
        ):
            return dataloader
        if dataloader.batch_size is None:
            raise ValueError("SSPStrategy needs a training DataLoader with a batch_size (the server deals batches)")
        limit = self._limit_train_batches
        self.dataset_shape = DatasetShape(
            num_samples=len(dataloader.dataset),
            batch_size=dataloader.batch_size,
            drop_last=dataloader.drop_last,
            max_chunks=None if isinstance(limit, float) else int(limit) * self.num_workers,
            seed=int(os.environ.get("PL_GLOBAL_SEED", 0)),  # DistributedSampler's seed: the same epoch order
        )
        return _update_dataloader(dataloader, ServerSampler(self), mode=RunningStage.TRAINING)

    def _start_data_epoch(self, epoch: int) -> None:
        if epoch != self._dealt_epoch:
            self._dealt.clear()
            self._dealt_epoch, self._data_epoch_over = epoch, False

    def _next_chunk(self, epoch: int) -> torch.Tensor | None:
        """The next batch's indices: one that came with the last parameters, or one asked for now."""
        if self._dealt:
            return self._dealt.popleft()
        if self._data_epoch_over:
            return None
        chunk = self.client.next_chunk(epoch, self.dataset_shape)
        self._data_epoch_over = chunk is None
        return chunk

    def on_sync_start(self, trainer: pl.Trainer) -> None:
        if self.global_rank == 0:
            self.client.init(self.optimizers[0])
        super().barrier("ssp-init")
        self._pull_at_sync()

    # ------------------------------------------------------------------ the training step
    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        if self.client is None:
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        model = model or self.lightning_module
        # Instead of stepping: push and pull, or (batch mode) add the gradient to the pass's sum.
        step = ReplacedStep(unwrap_optimizer(optimizer), self._accumulate if self.batch_mode else self._push_and_pull)
        return self.precision_plugin.optimizer_step(step, model=model, closure=closure, **kwargs)

    def _push_and_pull(self, optimizer: torch.optim.Optimizer) -> None:
        flat_grad = self._flat_grad()
        start = time.perf_counter()
        want = None if self._data_epoch_over or self._dealt_epoch is None else self._dealt_epoch
        info = self.client.push(flat_grad, [group["lr"] for group in optimizer.param_groups], self._flat, want)
        waited = time.perf_counter() - start
        if info.chunk is not None:
            self._dealt.append(info.chunk)
        self._data_epoch_over |= info.epoch_over
        self.communication_wait_s += waited
        stats = self._epoch
        stats["wait_s"] += waited
        stats["iterations"] += 1
        stats["staleness_sum"] += info.staleness
        stats["staleness_max"] = max(stats["staleness_max"], info.staleness)
        stats["max_gap"] = max(stats["max_gap"], info.max_gap)
        self._load_flat()

    def _flat_grad(self) -> torch.Tensor:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params]
        return torch.cat([g.reshape(-1) for g in grads]).to("cpu", torch.float32)

    def _accumulate(self, optimizer: torch.optim.Optimizer) -> None:
        """Batch mode: add this step's mean gradient times its sample count to the pass's sum."""
        if self._pass_grad is None:
            self._pass_grad = torch.zeros_like(self._flat)
        self._pass_grad.add_(self._flat_grad(), alpha=float(self._step_samples))
        self._pass_samples += self._step_samples
        self._step_samples = 0
        self._epoch["iterations"] += 1

    def _push_pass(self) -> None:
        """Batch mode, end of the pass: push the gradient sum once; the server steps once all have."""
        flat = self._pass_grad if self._pass_grad is not None else torch.zeros_like(self._flat)
        lrs = [group["lr"] for group in self.optimizers[0].param_groups]
        start = time.perf_counter()
        self.client.push(flat, lrs, self._flat, weight=self._pass_samples)
        waited = time.perf_counter() - start
        self.communication_wait_s += waited
        self._epoch["wait_s"] += waited
        self._pass_grad, self._pass_samples, self._step_samples = None, 0, 0
        self._load_flat()

    def _load_flat(self) -> None:
        offset = 0
        with torch.no_grad():
            for p in self._params:
                n = p.numel()
                p.copy_(self._flat[offset : offset + n].view_as(p))
                offset += n

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.client is not None:
            if not self._async:  # the epoch's first batch (on_train_epoch_start is skipped on some restarts)
                self._begin_async_phase()
            first = batch[0] if isinstance(batch, (list, tuple)) else batch
            samples = len(first) if hasattr(first, "__len__") else 1
            self._epoch["samples"] += samples
            self._step_samples += samples
        super().on_train_batch_start(batch, batch_idx)

    # ------------------------------------------------------------------ sync points
    def _reset_epoch_stats(self) -> None:
        self._epoch: dict[str, float] = dict(iterations=0, samples=0, staleness_sum=0, staleness_max=0, wait_s=0.0, max_gap=0)
        self._epoch_start = time.perf_counter()

    def _begin_async_phase(self) -> None:
        self._reset_epoch_stats()
        self._async = True

    def sync_point(self) -> None:
        """End of this worker's epoch: wait for all workers, take the server's parameters (idempotent)."""
        if not self._async or self.client is None:
            return
        self._epoch["train_s"] = time.perf_counter() - self._epoch_start
        if self.batch_mode:
            self._push_pass()
        self._pull_at_sync()
        self._async = False

    def _pull_at_sync(self) -> None:
        if self._dealt:
            raise RuntimeError(f"worker {self.global_rank}: {len(self._dealt)} dealt batches left unused at a sync point")
        self.client.finish(self._flat)
        self._load_flat()
        for buffer in self.lightning_module.buffers():
            broadcast_(buffer, src=0)
        if self.global_rank == 0:
            # The server's optimizer state (momentum, moments), so that checkpoints written now hold it.
            # The hyperparameters stay the local ones: the LR schedulers run here, the server only
            # applies the learning rate each push brings.
            optimizer = self.optimizers[0]
            state = self.client.optimizer_state()
            for local, remote in zip(optimizer.param_groups, state["param_groups"]):
                remote.update({key: value for key, value in local.items() if key != "params"})
            optimizer.load_state_dict(state)

    def after_epoch_sync(self, pl_module: pl.LightningModule) -> None:
        """Gather every worker's figures of the epoch; log them as ``ssp/worker{rank}/...``."""
        e = self._epoch
        mine = WorkerEpochStats(
            iterations=int(e["iterations"]), samples=int(e["samples"]),
            staleness_mean=e["staleness_sum"] / max(e["iterations"], 1), staleness_max=int(e["staleness_max"]),
            wait_s=e["wait_s"], train_s=e.get("train_s", 0.0), max_gap=int(e["max_gap"]),
            samples_per_s=e["samples"] / max(e.get("train_s", 0.0), 1e-9),
        )
        fields = list(asdict(mine))
        local = torch.tensor([float(v) for v in asdict(mine).values()], dtype=torch.float64)
        gathered = all_gather(local)
        epoch_stats = [WorkerEpochStats(**{f: type(getattr(mine, f))(v) for f, v in zip(fields, t.tolist())}) for t in gathered]
        self.history.append(epoch_stats)
        # Every worker logs the same gathered values (sync_dist averages identical numbers: no warning).
        for rank, stats in enumerate(epoch_stats):
            for name, value in asdict(stats).items():
                pl_module.log(f"ssp/worker{rank}/{name}", float(value), on_step=False, on_epoch=True, sync_dist=True)
        pl_module.log("ssp/max_gap", float(max(s.max_gap for s in epoch_stats)), on_step=False, on_epoch=True, sync_dist=True)

    def on_sync_end(self) -> None:
        if self.client is None:
            return
        self.sync_point()
        super().barrier("ssp-end")
        if self.global_rank == 0:
            self.client.shutdown()
            self._stop_server()
        self.client = None

    def _stop_server(self) -> None:
        if self._server is None:
            return
        try:
            self._server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._server.kill()
        self._server = None

    # ------------------------------------------------------------------ Lightning's collectives
    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        if self._async:
            if not self._warned_local_reduce:
                rank_zero_warn(
                    "SSPStrategy: a sync_dist reduction between sync points stays local to each worker (workers are "
                    "at different steps). Epoch-level metrics are reduced at the epoch's global sync."
                )
                self._warned_local_reduce = True
            return tensor
        return super().reduce(tensor, group=group, reduce_op=reduce_op)

    def barrier(self, name: str | None = None) -> None:
        if not self._async:
            super().barrier(name)

    def teardown(self) -> None:
        if self._own_callback is not None and self.lightning_module is not None and self.lightning_module._trainer:
            self.lightning_module.trainer.limit_train_batches = self._limit_train_batches
        if self._server is not None and self._server.poll() is None:
            self._server.terminate()
            self._stop_server()
        self.client = None
        self._async = False
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(
            "ssp", cls, description="Delay-synchronous data parallelism with a parameter server (staleness 3)"
        )
        strategy_registry.register(
            "ssp_bounded", cls, description="Stale-synchronous parallel (Ho et al. 2013), staleness 3", sync="bounded"
        )
        strategy_registry.register("ssp_async", cls, description="Fully asynchronous parameter server", staleness=math.inf)
        strategy_registry.register(
            "cneural", cls, description="Batch-mode master-worker training, one update per pass (Gu et al. 2013)",
            batch_mode=True,
        )
