# Generated from lightning_hybrid/strategies/ssp.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""SSPStrategy: data parallelism with a parameter server and bounded staleness (Lightning glue).

The server, its wire protocol and the staleness rules live in :mod:`lightning_hybrid.parameter_server`;
the sync points and the server process are :class:`~lightning_hybrid.lightning.strategies.parameter_server.ParameterServerStrategy`'s.
This module adds what is SSP's own: the training sampler that asks the server for batches, and
an optimizer step that pushes the gradient and pulls the newest parameters.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import warnings
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities.data import _update_dataloader
from torch.utils.data import Sampler, SequentialSampler

from lightning_hybrid.comm.flat import gradients
from lightning_hybrid.parameter_server.client import PullInfo
from lightning_hybrid.parameter_server.dispenser import chunks_per_epoch, segment_chunks
from lightning_hybrid.parameter_server.gradient_mask import has_gradient
from lightning_hybrid.parameter_server.protocol import DatasetShape
from lightning_hybrid.parameter_server.sync_controller import validate_staleness
from lightning_hybrid.parameter_server.update_rule import UpdateRule
from lightning_hybrid.lightning.strategies.refusals import refuse_unindexed_training_data
from lightning_hybrid.lightning.strategies.parameter_server import ParameterServerStrategy, WorkerEpochStats
from lightning_hybrid.lightning.strategies.step_count import ServerSteps

__all__ = ["SSPStrategy", "ServerSampler", "WorkerEpochStats"]

#: With overlap, batches a worker holds at the start of an epoch (one more arrives with each reply).
STOCK = 3


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
            self.strategy._yielded(chunk)
            yield from chunk[0].tolist()


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
            :class:`~lightning_hybrid.lightning.strategies.parameter_server.ParameterServerStrategy`.
        pushes_per_update: with staleness > 0, pushes the server averages into one optimizer step
            (``None``: one per worker, DDP's global batch, so the learning rate of
            ``configure_optimizers`` means what it means under DDP: the rate of one step on
            ``workers x batch`` samples); ``1``: every push is a step.
        staleness_lr: weight each pushed gradient by ``1 / staleness`` (in server steps; Zhang et al. 2016).
        momentum_correction: lower SGD's momentum for the measured staleness (Mitliagkas et al. 2016):
            ``"mean_delay"`` (or ``True``: the update's mean delay stays the configured momentum's),
            ``"subtract"`` (the implicit momentum subtracted: the rule before, a far larger cut) or
            ``False``. See :mod:`lightning_hybrid.parameter_server.update_rule`.
        restart_steps: the momentum correction leaves out the staleness of the gradients pushed in
            this many server steps after each global synchronization (the workers resume at
            different moments: a transient, not the asynchrony the correction is for). 0: count all.
        overlap: with staleness > 0, send each push in the background and compute the next batch
            meanwhile, on the parameters the previous reply brought (each gradient then is one
            server step staler, and a worker the bound holds back computes one more batch before it
            waits). Off by default: on this package's benchmarks fresh gradients paid more than
            hidden communication.
        step_patience: with staleness > 0 and no overlap, a push that does not complete an update
            may wait for it up to this fraction of the worker's cycle (from the server's reply to
            its next push: everything the worker does, its waits for the server excluded), when its
            peers are expected to complete it by then (:mod:`lightning_hybrid.parameter_server.step_wait`):
            workers that keep pace read fresh parameters, a lagging one holds nobody back. 0: never.
        batch_mode: deprecated; ``SSPStrategy(batch_mode=True)`` returns a
            :class:`~lightning_hybrid.lightning.strategies.cneural.CNeuralStrategy` (``strategy="cneural"``).

    Semantics to know:

    * Sync points: the end of every training epoch (before validation), the start and end of
      fitting. Validation, checkpoints, early stopping and epoch-level ``sync_dist`` logging happen
      there. Between them workers are at different steps: a step-level ``sync_dist`` reduction
      (``self.log(..., on_step=True, sync_dist=True)`` in ``training_step``) is refused with an
      error at the first step; log it with ``on_step=False`` or ``sync_dist=False``.
    * The schedulers run on each worker as usual, and every number of the optimizer's param groups
      (learning rate, momentum, betas, weight decay...) travels with each push: the server steps at the
      pushing worker's values (staleness 0: the round's, DDP's). Gradient clipping
      (``gradient_clip_val``) clips the averaged gradient the server steps with, as DDP clips the
      average. The optimizer state (momentum, Adam moments) is the server's and lands in checkpoints
      at each sync point. Resuming from such a checkpoint continues the run.
    * Mid-epoch validation (``val_check_interval``: a fraction of each worker's share of the epoch,
      or N batches per worker, as under DDP): the server cuts each epoch into segments of that many
      batches of all workers, with a global sync between them; validation runs there.
    * ``trainer.global_step`` is the server's optimizer steps (the steps of the parameters the worker
      last pulled; the same on every worker at a sync point), and what Lightning drives by steps
      follows it (:mod:`~lightning_hybrid.lightning.strategies.step_count`): ``max_steps`` (exactly that many
      server steps at any staleness; ``fast_dev_run`` too: one step), step-interval LR schedulers
      (one scheduler step per server step), the loggers' step (``log_every_n_steps``).
      ``limit_train_batches`` (N batches or a fraction of each worker's share of DDP's split) caps
      the batches the server deals per epoch at what DDP trains over all ranks.
      ``overfit_batches`` (any sequential sampler) deals the same batches, in order, every epoch.
    * Not supported (a clear error before workers start): manual optimization, several
      optimizers, a time-based ``val_check_interval``, step- or time-based checkpointing (between
      sync points the workers hold different server steps: no step N is every worker's), fp16
      with a gradient scaler, fewer than two workers.
    * BatchNorm-style buffers stay per worker during an epoch and are broadcast from worker 0 at
      the epoch's synchronization.

    Examples:
        >>> import lightning.pytorch as pl
        >>> from lightning_hybrid import SSPStrategy
        >>> strategy = SSPStrategy(staleness=3, sync="delay")
        >>> trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False)
        >>> trainer.world_size  # workers; the parameter server is one process more
        2
        >>> pl.Trainer(accelerator="cpu", devices=2, strategy="ssp_async", logger=False).strategy.staleness
        inf
        >>> # trainer.fit(model, datamodule=data)
    """

    strategy_name = "ssp"
    aliases = {
        "ssp_delay": ("Delay-synchronous parallel with a parameter server (Zhang et al. 2017), staleness 3", {}),
        "ssp_bounded": ("Stale-synchronous parallel (Ho et al. 2013), staleness 3", {"sync": "bounded"}),
        "ssp_async": ("Fully asynchronous parameter server", {"staleness": math.inf}),
    }
    #: "ssp" was the delay-synchronous rule, which is not Ho et al.'s stale-synchronous parallel (ssp_bounded).
    renamed_aliases = {"ssp": "ssp_delay"}
    metrics_prefix = "ssp"
    validates_mid_epoch = True

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        bound = inspect.signature(cls.__init__).bind(None, *args, **kwargs).arguments
        if not bound.get("batch_mode"):
            return super().__new__(cls)
        from lightning_hybrid.lightning.strategies.cneural import CNeuralStrategy

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
        pushes_per_update: int | None = None,
        staleness_lr: bool = True,
        momentum_correction: bool | str = True,
        restart_steps: int = 10,
        overlap: bool = False,
        step_patience: float = 1.0,
        batch_mode: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(timeout, **kwargs)
        self.staleness = validate_staleness(staleness, sync)
        self.sync = sync
        # the server builds the rule; a bad value is a ValueError now, before any process starts
        rule = UpdateRule(1 if pushes_per_update is None else pushes_per_update,
                          momentum_correction=momentum_correction, restart_steps=restart_steps)
        self.pushes_per_update = pushes_per_update
        self.staleness_lr = bool(staleness_lr)
        self.momentum_correction = rule.momentum_correction
        self.restart_steps = restart_steps
        self.overlap = bool(overlap)
        if not step_patience >= 0:
            raise ValueError(f"step_patience must be >= 0 (0: never wait for the step), got {step_patience}")
        self.step_patience = float(step_patience)
        self._comm: ThreadPoolExecutor | None = None  # sends pushes while the worker computes (overlap)
        self._in_flight: Future[PullInfo] | None = None
        self.dataset_shape: DatasetShape | None = None
        # Batches the server sent along with parameters, not yet handed to the DataLoader.
        self._dealt: deque[tuple[torch.Tensor, int]] = deque()  # (indices, the epoch's segment they belong to)
        self._dealt_epoch: int | None = None
        self._data_epoch_over = False
        self._stopped_inside_epoch = False  # max_steps was reached before the epoch's data ran out
        self._limit_train_batches: int | float = 1.0
        self._batches_since_push = 0  # the dealt batches the next push's gradient covers
        self._val_check_interval: int | float = 1.0  # the user's; Lightning sees 1.0 (the epoch's length is unknown)
        self._segment = 0  # the segment of the epoch this worker trains in
        self._handed_out = 0  # batches of this epoch handed to the DataLoader
        self._sync_before: int | None = None  # the first batch of the next segment (sync before training it)
        self._segment_sync = False  # the last sync point was a segment's, not the epoch's end
        self._saving_after_validation: list[Any] = []  # ModelCheckpoints told to save after validation (undone at teardown)
        self._server_steps: ServerSteps | None = None  # trainer.global_step: the server's steps

    def _update_rule(self) -> dict[str, Any]:
        return {
            "pushes_per_update": self.pushes_per_update or self.num_workers,
            "pushes_follow_workers": self.pushes_per_update is None,
            "staleness_lr": self.staleness_lr,
            "momentum_correction": self.momentum_correction,
            "restart_steps": self.restart_steps,
            # with overlap the next gradient is computed before the reply is read: waiting buys nothing
            "step_patience": 0.0 if self.overlap else self.step_patience,
        }

    # ------------------------------------------------------------------ checks and setup
    def check_val_check_interval(self, trainer: pl.Trainer) -> None:
        """Mid-epoch validation works (the server cuts the epoch into segments with a global sync
        between them), within each epoch."""
        super().check_val_check_interval(trainer)
        if trainer.val_check_interval != 1.0 and trainer.check_val_every_n_epoch is None:
            raise ValueError(
                "SSPStrategy places mid-epoch validation within each epoch; check_val_every_n_epoch=None (validation "
                "counted over all epochs' batches) has no such point. Set check_val_every_n_epoch=1."
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
        # Mid-epoch validation at the server's segment syncs (Lightning would refuse a fractional
        # interval for an epoch of unknown length; the strategy tells it when a segment ended).
        self._val_check_interval, trainer.val_check_interval = trainer.val_check_interval, 1.0
        if self._val_check_interval != 1.0:  # ModelCheckpoint saves after each validation, as under DDP
            self._saving_after_validation = [c for c in trainer.checkpoint_callbacks if c._save_on_train_epoch_end is None]
            for callback in self._saving_after_validation:
                callback._save_on_train_epoch_end = False
        epoch_loop = trainer.fit_loop.epoch_loop
        if not getattr(epoch_loop._should_check_val_fx, "segment_syncs", False):
            should_check_val = epoch_loop._should_check_val_fx

            def should_check_val_or_segment_ended(data_fetcher: Any) -> bool:
                ended = self._segment_ended(epoch_loop.batch_idx)
                if self._stopped_inside_epoch:  # max_steps inside an epoch: no validation, as under DDP
                    return False
                return should_check_val(data_fetcher) or (ended and epoch_loop._should_check_val_epoch())

            should_check_val_or_segment_ended.segment_syncs = True
            epoch_loop._should_check_val_fx = should_check_val_or_segment_ended
        if self.overlap and self.staleness > 0:
            self._comm = ThreadPoolExecutor(1, thread_name_prefix="ssp-push")
        self._server_steps = ServerSteps(trainer, self._steps_before)
        self._stopped_inside_epoch = False

    # ------------------------------------------------------------------ data from the server
    def check_training_data(self, loader: object) -> None:
        refuse_unindexed_training_data("SSPStrategy", loader, "deals sample indices to its workers from the server")
        if loader.batch_size is None:  # type: ignore[attr-defined]
            raise ValueError("SSPStrategy needs a training DataLoader with a batch_size (the server deals batches of "
                             "sample indices; a batch_sampler of the DataLoader's own is replaced): pass batch_size=")

    def process_dataloader(self, dataloader: object) -> object:
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if self.client is None or trainer is None or not trainer.training:
            return dataloader
        self.check_training_data(dataloader)
        self.dataset_shape = DatasetShape(
            num_samples=len(dataloader.dataset),
            batch_size=dataloader.batch_size,
            drop_last=dataloader.drop_last,
            max_chunks=self._epoch_chunks(len(dataloader.dataset), dataloader.batch_size, dataloader.drop_last),
            seed=int(os.environ.get("PL_GLOBAL_SEED", 0)),  # DistributedSampler's seed: the same epoch order
            # Unshuffled when the user's sampler is sequential (or overfit_batches made it so): the
            # same batches every epoch, as under DDP.
            shuffle=not isinstance(dataloader.sampler, SequentialSampler) and getattr(dataloader.sampler, "shuffle", True),
        )
        num_chunks = chunks_per_epoch(len(dataloader.dataset), dataloader.batch_size, dataloader.drop_last,
                                      self.dataset_shape.max_chunks)
        segment = segment_chunks(self._val_check_interval, num_chunks, self.num_workers)
        self.dataset_shape = dataclasses.replace(self.dataset_shape, segment_chunks=segment)
        return _update_dataloader(dataloader, ServerSampler(self), mode=RunningStage.TRAINING)

    def _epoch_chunks(self, samples: int, batch_size: int, drop_last: bool) -> int | None:
        """The batches the server deals per epoch under ``limit_train_batches`` (None: all), as many as
        DDP trains over all its ranks: N per rank for an integer N; for a fraction, that fraction of each
        rank's share of DDP's split (``ceil(samples / workers)`` samples), rounded down as Lightning does."""
        limit, workers = self._limit_train_batches, self.num_workers
        if isinstance(limit, int):
            return limit * workers
        if limit >= 1.0:
            return None
        per_worker = chunks_per_epoch(math.ceil(samples / workers), batch_size, drop_last)
        return max(1, int(per_worker * limit)) * workers

    def _start_data_epoch(self, epoch: int) -> None:
        if epoch != self._dealt_epoch:
            self._dealt.clear()
            self._dealt_epoch, self._data_epoch_over = epoch, False
            self._segment, self._handed_out, self._sync_before = 0, 0, None

    def _yielded(self, chunk: tuple[torch.Tensor, int]) -> None:
        """A batch goes to the DataLoader: if it is the first of a later segment, sync before it."""
        if chunk[1] > self._segment and self._sync_before is None:
            self._sync_before = self._handed_out
        self._handed_out += 1

    def _segment_ended(self, batch_idx: int) -> bool:
        """After training batch ``batch_idx``: if the next is the first of the next segment, meet the
        other workers at the server now (validation or not) and say so."""
        if self._sync_before is None or batch_idx + 1 < self._sync_before:
            return False
        self._segment_sync = True
        self.sync_point()
        self._segment += 1
        self._sync_before = None
        return True

    def _next_chunk(self, epoch: int) -> tuple[torch.Tensor, int] | None:
        """The next batch's indices: one that came with the last parameters, or one asked for now.

        With overlap, the first request of an epoch asks for :data:`STOCK` batches, so that the
        DataLoader (which fetches a batch ahead) never waits for the push in flight, whose reply
        brings the next one."""
        if not self._dealt and self._in_flight is not None:
            self._settle()
        if self._dealt:
            return self._dealt.popleft()
        for _ in range(STOCK if self._comm is not None else 1):
            if self._data_epoch_over:
                break
            chunk = self.client.next_chunk(epoch, self.dataset_shape)
            self._data_epoch_over = chunk is None
            if chunk is not None:
                self._dealt.append(chunk)
                if chunk[1] > self._segment:  # the next segment's first batch: no more before its sync
                    break
        return self._dealt.popleft() if self._dealt else None

    # ------------------------------------------------------------------ the training step
    def _count_samples(self, samples: int) -> None:
        super()._count_samples(samples)
        self._batches_since_push += 1

    def _replaced_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Push this step's gradient and take the newest parameters (with the next batch's indices). The push
        carries the hyperparameters the schedulers set for this step and Lightning's clip, which the server
        applies to the average it steps with (DDP clips the average).

        Without overlap the worker waits for the reply. With overlap (staleness > 0) it takes the
        reply to its previous push (usually there already), loads those parameters and sends this
        gradient in the background while it computes the next one; the gradient carries the step
        of the parameters it was computed at, so the server counts its staleness right."""
        want = None if self._data_epoch_over or self._dealt_epoch is None else self._dealt_epoch
        hyper, read, clip = self._hyperparameters(optimizer), self._weights_version, self._clips.take()
        batches, self._batches_since_push = max(1, self._batches_since_push), 0
        # Parameters without a gradient (frozen, unused) in any of the accumulated batches: not stepped.
        has = has_gradient(self._params)
        if self._comm is None:
            # The gradients are read and the parameters written in place: no flat copy of the model here.
            grads = gradients(self._params)
            info = self._timed(lambda: self.client.push(grads, hyper, self._params, want, read_version=read, batches=batches,
                                                        has_gradient=has, clip=clip))
            self._received(info, loaded=True)
            return
        grad = self._flat_grad()  # sent while the next batch computes: a copy the backward pass cannot touch
        self._settle()
        self._in_flight = self._comm.submit(self.client.push, grad, hyper, self._flat, want, 1, read, batches,
                                            has_gradient=has, clip=clip)

    def _settle(self) -> None:
        """Wait for the push in flight, if any, and take what its reply brings."""
        if self._in_flight is not None:
            future, self._in_flight = self._in_flight, None
            self._received(self._timed(future.result))

    def _received(self, info: PullInfo, loaded: bool = False) -> None:
        """Take what a reply brings; the parameters into the model unless ``loaded`` (they went there)."""
        self._note(info)
        self._server_steps.server_at(info.version)
        if info.chunk is not None:
            self._dealt.append((info.chunk, info.chunk_segment))
        self._data_epoch_over |= info.epoch_over or info.stop
        self._stopped_inside_epoch |= info.stopped_inside_epoch
        stats = self._epoch
        stats["iterations"] += 1
        stats["staleness_sum"] += info.staleness
        stats["staleness_max"] = max(stats["staleness_max"], info.staleness)
        stats["max_gap"] = max(stats["max_gap"], info.max_gap)
        if not loaded:
            self._load_flat()

    def _pull_at_sync(self) -> None:
        self._settle()
        super()._pull_at_sync()
        self._server_steps.server_at(self._weights_version)
        self._server_steps.synchronized()

    def _begin_async_phase(self) -> None:
        if self._segment_sync:  # the epoch goes on after a segment's sync: its figures too
            self._async = True
        else:
            super()._begin_async_phase()
            self._batches_since_push = 0
        self._segment_sync = False

    def _before_sync(self) -> None:
        """The epoch's end: every batch the server dealt this worker has been trained on."""
        self._settle()
        if self._dealt and not self._segment_sync:
            raise RuntimeError(f"worker {self.global_rank}: {len(self._dealt)} dealt batches left unused at the epoch's end")

    def teardown(self) -> None:
        if self._comm is not None:
            self._comm.shutdown(wait=False, cancel_futures=True)
            self._comm, self._in_flight = None, None
        if self._own_callback is not None and self.lightning_module is not None and self.lightning_module._trainer:
            self.lightning_module.trainer.limit_train_batches = self._limit_train_batches
            self.lightning_module.trainer.val_check_interval = self._val_check_interval
        for callback in self._saving_after_validation:
            callback._save_on_train_epoch_end = None
        self._saving_after_validation = []
        if self._server_steps is not None:
            self._server_steps.remove()
            self._server_steps = None
        super().teardown()
