"""SSPStrategy: data parallelism with a parameter server and bounded staleness (Lightning glue).

The server, its wire protocol and the staleness rules live in :mod:`lightning_hybrid.parameter_server`;
the sync points and the server process are :class:`~lightning_hybrid.strategies.parameter_server.ParameterServerStrategy`'s.
This module adds what is SSP's own: the training sampler that asks the server for batches, and
an optimizer step that pushes the gradient and pulls the newest parameters.
"""

from __future__ import annotations

import inspect
import math
import os
import warnings
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.trainer.states import RunningStage
from pytorch_lightning.utilities.data import _update_dataloader
from torch.utils.data import DataLoader, Sampler

from lightning_hybrid.parameter_server.protocol import DatasetShape
from lightning_hybrid.parameter_server.sync_controller import validate_staleness
from lightning_hybrid.strategies.parameter_server import ParameterServerStrategy, WorkerEpochStats

__all__ = ["SSPStrategy", "ServerSampler", "WorkerEpochStats"]


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


class SSPStrategy(ParameterServerStrategy):
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
        timeout, process_group_backend, processes_per_device: see
            :class:`~lightning_hybrid.strategies.parameter_server.ParameterServerStrategy`.
        batch_mode: deprecated; ``SSPStrategy(batch_mode=True)`` returns a
            :class:`~lightning_hybrid.strategies.cneural.CNeuralStrategy` (``strategy="cneural"``).

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
    """

    strategy_name = "ssp"
    aliases = {
        "ssp": ("Delay-synchronous data parallelism with a parameter server (staleness 3)", {}),
        "ssp_bounded": ("Stale-synchronous parallel (Ho et al. 2013), staleness 3", {"sync": "bounded"}),
        "ssp_async": ("Fully asynchronous parameter server", {"staleness": math.inf}),
    }
    metrics_prefix = "ssp"

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        bound = inspect.signature(cls.__init__).bind(None, *args, **kwargs).arguments
        if not bound.get("batch_mode"):
            return super().__new__(cls)
        from lightning_hybrid.strategies.cneural import CNeuralStrategy

        warnings.warn(
            "SSPStrategy(batch_mode=True) is deprecated and will be removed in the next release; use "
            "CNeuralStrategy() (strategy='cneural')", DeprecationWarning, stacklevel=2,
        )
        rest = {k: v for k, v in bound.items() if k not in ("self", "staleness", "sync", "batch_mode", "kwargs")}
        return CNeuralStrategy(**rest, **bound.get("kwargs", {}))

    def __init__(
        self,
        staleness: float | int = 3,
        sync: str = "delay",
        timeout: float = 300.0,
        batch_mode: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(timeout, **kwargs)
        self.staleness = validate_staleness(staleness, sync)
        self.sync = sync
        self.dataset_shape: DatasetShape | None = None
        # Batches the server sent along with parameters, not yet handed to the DataLoader.
        self._dealt: deque[torch.Tensor] = deque()
        self._dealt_epoch: int | None = None
        self._data_epoch_over = False
        self._limit_train_batches: int | float = 1.0

    # ------------------------------------------------------------------ checks and setup
    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        super().check_trainer(trainer, model)
        limit = trainer.limit_train_batches
        if isinstance(limit, float) and limit != 1.0:
            raise ValueError(
                f"SSPStrategy supports limit_train_batches as an integer (batches per worker, pooled) or 1.0, got {limit}"
            )

    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        if self.client is None:
            return
        # The server decides how many batches each worker gets; an integer limit_train_batches caps the
        # epoch's total (limit x workers) there. Lightning must see the epoch as of unknown length, so
        # that it ends, and validates, when the server's data runs out.
        self._limit_train_batches = trainer.limit_train_batches
        trainer.limit_train_batches = 1.0

    # ------------------------------------------------------------------ data from the server
    def process_dataloader(self, dataloader: object) -> object:
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if self.client is None or trainer is None or not trainer.training or not isinstance(dataloader, DataLoader):
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

    # ------------------------------------------------------------------ the training step
    def _replaced_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Push this step's gradient, pull the newest parameters (and the next batch with them)."""
        want = None if self._data_epoch_over or self._dealt_epoch is None else self._dealt_epoch
        lrs, grad = [group["lr"] for group in optimizer.param_groups], self._flat_grad()
        info = self._timed(lambda: self.client.push(grad, lrs, self._flat, want))
        if info.chunk is not None:
            self._dealt.append(info.chunk)
        self._data_epoch_over |= info.epoch_over
        stats = self._epoch
        stats["iterations"] += 1
        stats["staleness_sum"] += info.staleness
        stats["staleness_max"] = max(stats["staleness_max"], info.staleness)
        stats["max_gap"] = max(stats["max_gap"], info.max_gap)
        self._load_flat()

    def _pull_at_sync(self) -> None:
        if self._dealt:
            raise RuntimeError(f"worker {self.global_rank}: {len(self._dealt)} dealt batches left unused at a sync point")
        super()._pull_at_sync()

    def teardown(self) -> None:
        if self._own_callback is not None and self.lightning_module is not None and self.lightning_module._trainer:
            self.lightning_module.trainer.limit_train_batches = self._limit_train_batches
        super().teardown()
