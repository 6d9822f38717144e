"""BalancedDataParallelStrategy: synchronous data parallelism whose ranks take shares of the global
batch proportional to their speeds (Lightning glue).

The algorithm lives in :mod:`lightning_hybrid.balance`. This module installs its batch sampler in the
training DataLoader, weights each batch's loss by the rank's share, registers the timed summing DDP
communication hook on every device, gathers the measurements and changes the shares at an agreed
step, logs the shares, speeds and waits, and keeps the shares in checkpoints.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.trainer.states import RunningStage, TrainerFn
from pytorch_lightning.utilities.data import _get_dataloader_init_args_and_kwargs, _reinstantiate_wrapped_cls
from pytorch_lightning.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch.utils.data import DistributedSampler, SequentialSampler

from lightning_hybrid.balance import (
    BalancedBatchSampler,
    CycleClock,
    Dealt,
    Meter,
    ShareSchedule,
    SpeedEstimator,
    agreed_start,
    apportion,
    check_global_batch,
    check_speeds,
    timed_sum_hook,
    worth_changing,
)
from lightning_hybrid.comm.collectives import all_gather
from lightning_hybrid.strategies.checked_ddp import CheckedDDPStrategy
from lightning_hybrid.strategies.refusals import refuse_manual_optimization, refuse_unindexed_training_data
from lightning_hybrid.strategies.agreements import Agreement, Deferred, EveryBatch

__all__ = ["BalanceEpochs", "BalancedDataParallelStrategy"]

#: The checkpoint entry holding the shares, the speed estimates and the next rebalancing step.
STATE_KEY = "balanced_data_parallel"


def _whole(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    return value


class BalanceEpochs(Callback):
    """Calls the strategy when each training epoch starts and ends (its per-epoch statistics) and
    after each validation (which interrupts the ranks' cycles)."""

    def __init__(self, strategy: BalancedDataParallelStrategy) -> None:
        self.strategy = strategy

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.strategy.on_epoch_start(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.strategy.on_epoch_end(trainer, pl_module)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.strategy.interrupt_cycle()  # mid-epoch validation (val_check_interval)


class BalancedDataParallelStrategy(CheckedDDPStrategy):
    """Synchronous data parallelism in which each rank trains on a share of a fixed global batch
    proportional to its speed, so that fast devices do not wait for slow ones.

    Every optimizer step covers ``global_batch`` samples of the epoch's seeded permutation; rank ``r``
    takes its share of them (:class:`~lightning_hybrid.balance.BalancedBatchSampler`, installed in
    place of Lightning's distributed sampler), its loss is weighted by ``share / global_batch`` and
    DDP sums the gradients (:func:`~lightning_hybrid.balance.timed_sum_hook`), so a step equals one
    step of single-process SGD on the global batch, whatever the shares. Shares are proportional to
    the speeds, rounded by largest remainder, each at least ``min_share``.

    Args:
        global_batch: samples per optimizer step over all ranks; ``None``: the training DataLoader's
            ``batch_size`` x the number of ranks.
        speeds: relative speeds, one positive number per rank (the shares are fixed by them unless
            ``rebalance_every`` re-measures); ``None``: equal shares until ``measure_steps`` steps
            have been measured, then shares from the measured speeds.
        measure_steps: with ``speeds=None``, the optimizer steps measured before the first balancing
            (the fit's first step is not measured: it warms up).
        rebalance_every: re-measure and rebalance every this many optimizer steps; ``0`` or ``None``: never.
        min_share: the fewest samples of a global batch any rank gets.
        smoothing: the weight of the newest measurement in the smoothed speeds (``1``: none).
        tolerance: shares change only when the new ones shorten the predicted step by more than this
            fraction (measured speeds are noisy: equal devices keep equal shares).
        find_unused_parameters: DistributedDataParallel's option.
        process_group_backend: ``None`` (nccl with one process per GPU, otherwise gloo) or a backend name.
        processes_per_device: processes started on each device the Trainer gives.

    A rank's speed is samples per second of its own time: its whole cycle from the end of one
    step's all-reduce until its next last gradient bucket is ready (the optimizer step, the user's
    hooks and callbacks, logging, data loading, forward, backward; :class:`~lightning_hybrid.balance.CycleClock`);
    the rest, until the all-reduce returns, is waiting. So a rank slow anywhere (a slow data
    loader, a heavy callback, a busier host) gets a smaller share, and waiting never counts as its
    time. The ranks gather their measurements every ``rebalance_every`` steps and a change takes
    effect at the first step that no rank's DataLoader has drawn yet
    (:func:`~lightning_hybrid.balance.agreed_start`), also mid-epoch.

    Logged on the steps the loggers write (``log_every_n_steps``; this rank): ``balanced/share``,
    ``balanced/busy_s``, ``balanced/wait_s``;
    each epoch, for every rank ``r``: ``balanced/rank{r}/share`` (at the epoch's last step),
    ``speed`` (samples per second of its own time in the epoch), ``busy_s`` and ``wait_s`` (totals).
    :attr:`share_changes` and :attr:`history` keep the same for the fit.

    Works with gradient clipping (of the summed gradient), accumulation (each batch's loss weighted
    by its own share, so shares may differ between the batches of one step), LR schedulers,
    bf16/fp16 precision, validation and test (plain DDP: each rank a DistributedSampler share) and
    checkpoints, which keep the shares, pending changes and speed estimates; resuming from an epoch-end
    checkpoint continues with them, and from a mid-epoch one under the
    :class:`~lightning_hybrid.preemption.Preemption` callback continues the epoch, the batches it had trained
    drawn and skipped (:meth:`on_batches_skipped`). ``inject_compute_slowdown`` (used by
    :class:`~lightning_hybrid.callbacks.HeterogeneitySimulator` with ``where="compute"``) slows this
    rank's forward and backward right before its last bucket's all-reduce. The module's loss must
    be a mean over its batch, as for DDP's averaged gradient.

    Refused before processes start: manual optimization, speeds that are not positive finite numbers
    or not one per rank, a global batch smaller than the ranks or than ranks x ``min_share``.

    Examples:
        >>> import pytorch_lightning as pl
        >>> from lightning_hybrid import BalancedDataParallelStrategy
        >>> from lightning_hybrid.balance import apportion
        >>> strategy = BalancedDataParallelStrategy(global_batch=128, speeds=[1.0, 3.0])
        >>> trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False)
        >>> apportion(128, [1.0, 3.0])  # each rank's samples of every global batch
        [32, 96]
        >>> # trainer.fit(model, datamodule=data)        or strategy="balanced": speeds measured, rebalanced
    """

    strategy_name = "balanced"
    aliases = {
        "balanced": (
            "Synchronous data parallelism with each rank's share of the global batch proportional to its measured speed",
            {},
        ),
    }

    def __init__(
        self,
        global_batch: int | None = None,
        speeds: list[float] | None = None,
        measure_steps: int = 10,
        rebalance_every: int | None = 100,
        min_share: int = 1,
        smoothing: float = 0.5,
        tolerance: float = 0.05,
        find_unused_parameters: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(ddp_kwargs={"find_unused_parameters": bool(find_unused_parameters)}, **kwargs)
        self.global_batch = None if global_batch is None else _whole("global_batch", global_batch, 1)
        self.speeds = None if speeds is None else check_speeds(speeds)
        self.measure_steps = _whole("measure_steps", measure_steps, 1)
        self.rebalance_every = _whole("rebalance_every", rebalance_every or 0, 0) or None
        self.min_share = _whole("min_share", min_share, 1)
        self.estimator = SpeedEstimator(smoothing)
        if not 0.0 <= tolerance < 1.0:
            raise ValueError(f"tolerance must be a fraction in [0, 1), got {tolerance}")
        self.tolerance = float(tolerance)
        #: Simulated slowdown of this rank's compute (set by lightning_hybrid.callbacks.HeterogeneitySimulator).
        self.compute_slowdown = 1.0
        #: Seconds this rank has waited in the all-reduce (the simulator does not stretch them).
        self.communication_wait_s = 0.0
        self.schedule: ShareSchedule | None = None
        self.sampler: BalancedBatchSampler | None = None
        self.clock: CycleClock | None = None
        #: Each change of shares in this fit: the step it was decided after, where it starts, the shares and speeds.
        self.share_changes: list[dict[str, Any]] = []
        #: Per epoch of this fit: every rank's share, samples, busy_s, wait_s and speed, and the speed estimates.
        self.history: list[dict[str, Any]] = []
        self._restored: dict[str, Any] | None = None
        self._next_decision: int | None = None
        self._loss_weight = 1.0
        self._batch: Dealt | None = None
        self._window_samples = 0
        self._timing: tuple[float, float] | None = None
        self._warming_up = True
        self._interval, self._epoch_meter = Meter(), Meter()

    # ------------------------------------------------------------------ checks
    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        """Refuse what the strategy cannot run (called before the other processes start)."""
        refuse_manual_optimization("BalancedDataParallelStrategy", model, "it weights each batch's loss by its share")
        ranks = self.num_nodes * self.num_processes
        if self.speeds is not None:
            check_speeds(self.speeds, ranks)
        if self.global_batch is not None:
            check_global_batch(self.global_batch, ranks, self.min_share)

    slows_its_compute = True  # Capabilities: a simulated straggler slows the compute itself

    def inject_compute_slowdown(self, factor: float) -> None:
        """Slow this rank's compute by ``factor`` inside the measured time (heterogeneity simulation)."""
        if not factor >= 1.0:
            raise ValueError(f"a compute slowdown factor must be >= 1.0, got {factor}")
        self.compute_slowdown = float(factor)
        if self.clock is not None:
            self.clock.slowdown = self.compute_slowdown

    # ------------------------------------------------------------------ setup
    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        self.check_trainer(trainer, self.lightning_module)
        self.schedule, self.sampler = None, None
        self.share_changes, self.history = [], []
        self._warming_up, self._window_samples, self._timing = True, 0, None
        self._interval.take()
        self.attach_callback(trainer, BalanceEpochs(self))

    def stop_agreement(self, trainer: pl.Trainer) -> Agreement:
        """A stop agreed a batch late: agreeing on it in the batch would be a second sync point in each
        step (a fast rank waiting there, before its compute, for a rank slow after its step)."""
        return Deferred(lag=1) if trainer.state.fn == TrainerFn.FITTING else EveryBatch()

    def _register_ddp_hooks(self) -> None:
        """Lightning registers DDP communication hooks on CUDA only; this one goes on every device and backend."""
        self.clock = CycleClock(self.compute_slowdown)
        self.model.register_comm_hook(self.clock, timed_sum_hook)

    def check_training_data(self, loader: object) -> None:
        refuse_unindexed_training_data("BalancedDataParallelStrategy", loader,
                                              "deals each rank its share of every global batch by sample index")
        if self.global_batch is None and loader.batch_size is None:  # type: ignore[attr-defined]
            raise ValueError(
                "BalancedDataParallelStrategy needs global_batch= when the training DataLoader has a batch_sampler "
                "of its own (the strategy replaces it)"
            )

    def process_dataloader(self, dataloader: object) -> object:
        """The training DataLoader with the balanced batch sampler in place of Lightning's distributed sampler."""
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if trainer is None or not trainer.training:
            return dataloader
        self.check_training_data(dataloader)
        global_batch = self.global_batch
        if global_batch is None:
            global_batch = dataloader.batch_size * self.world_size
        check_global_batch(global_batch, self.world_size, self.min_share)
        if self.schedule is None or (self.schedule.global_batch, self.schedule.world_size) != (global_batch, self.world_size):
            self.schedule = self._first_schedule(global_batch, trainer.global_step)
        sampler = dataloader.sampler
        if isinstance(sampler, DistributedSampler):
            seed, shuffle = sampler.seed, sampler.shuffle
        else:  # use_distributed_sampler=False: the global seed, as Lightning's sampler would have
            seed, shuffle = int(os.environ.get("PL_GLOBAL_SEED", "0")), not isinstance(sampler, SequentialSampler)
        fit_loop = trainer.fit_loop
        self.sampler = BalancedBatchSampler(
            len(dataloader.dataset), self.global_rank, self.schedule, seed=seed, drop_last=dataloader.drop_last,
            shuffle=shuffle, epoch_fn=lambda: fit_loop.epoch_progress.current.processed, min_share=self.min_share,
        )
        if self.sampler.dropped and not dataloader.drop_last:
            rank_zero_warn(
                f"BalancedDataParallelStrategy: the last global batch of each epoch has {self.sampler.dropped} samples, "
                f"fewer than the {self.world_size} ranks, and is left out (no rank can train on zero samples)"
            )
        args, kwargs = _get_dataloader_init_args_and_kwargs(dataloader, sampler, mode=RunningStage.TRAINING)
        kwargs.update(sampler=None, shuffle=False, batch_sampler=self.sampler, batch_size=1, drop_last=False)
        return _reinstantiate_wrapped_cls(dataloader, *args, **kwargs)

    def _first_schedule(self, global_batch: int, global_step: int) -> ShareSchedule:
        """The checkpoint's schedule when it was for this world size and global batch; otherwise shares
        from the given speeds (or equal ones), and the first balancing after ``measure_steps``."""
        state, self._restored = self._restored, None
        if state is not None:
            if (state["world_size"], state["global_batch"]) == (self.world_size, global_batch):
                schedule = ShareSchedule(state["schedule"]["changes"][0][2])
                schedule.load_state_dict(state["schedule"])
                self.estimator.load_state_dict(state["speeds"])
                self._next_decision = state["next_decision"]
                return schedule
            rank_zero_warn(
                f"BalancedDataParallelStrategy: the checkpoint's shares are for {state['world_size']} ranks and a global "
                f"batch of {state['global_batch']}; this run has {self.world_size} and {global_batch}, so shares start anew"
            )
        self.estimator.speeds = None
        if self.speeds is None:
            self._next_decision = global_step + 1 + self.measure_steps
        else:
            self._next_decision = global_step + self.rebalance_every if self.rebalance_every else None
        return ShareSchedule(apportion(global_batch, self.speeds or [1.0] * self.world_size, self.min_share))

    # ------------------------------------------------------------------ each batch and step
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)
        if self.sampler is None:
            return
        if not self.sampler.dealt:
            raise RuntimeError("BalancedDataParallelStrategy: a training batch its batch sampler did not deal")
        self._batch = self.sampler.dealt.popleft()
        self._loss_weight = self._batch.samples / self._batch.global_samples
        if self._window_samples == 0 and self.clock is not None:
            self.clock.start()  # the optimizer step's first batch
        self._window_samples += self._batch.samples

    def on_batches_skipped(self, batches: int) -> None:
        """A fit resumed mid-epoch drew the epoch's first ``batches`` batches without training them
        (lightning_hybrid.preemption): they are not the next ones to train."""
        if self.sampler is not None:
            for _ in range(min(batches, len(self.sampler.dealt))):
                self.sampler.dealt.popleft()

    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Weight the batch's (mean) loss by this rank's share of the global batch; DDP then sums."""
        return super().backward(closure_loss * self._loss_weight, optimizer, *args, **kwargs)

    def post_backward(self, closure_loss: torch.Tensor) -> None:
        super().post_backward(closure_loss)
        timing = self.clock.backward_done() if self.clock is not None else None
        if timing is not None:
            self._timing = timing
            self.communication_wait_s += timing[1]

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        output = super().optimizer_step(optimizer, closure, model, **kwargs)
        if self.sampler is None or self._batch is None:
            return output
        samples, timing = self._window_samples, self._timing
        self._window_samples, self._timing = 0, None
        module = self.lightning_module
        if timing is not None:
            busy, wait = timing
            self._epoch_meter.add(samples, busy, wait)
            if not self._warming_up:
                self._interval.add(samples, busy, wait)
            self._warming_up = False
            if module.trainer._logger_connector.should_update_logs:  # the steps the loggers write (log_every_n_steps)
                module.log("balanced/share", float(self._batch.samples), on_step=True, on_epoch=False)
                module.log("balanced/busy_s", busy, on_step=True, on_epoch=False)
                module.log("balanced/wait_s", wait, on_step=True, on_epoch=False)
        done = module.trainer.global_step + 1  # Lightning counts this step once the strategy has made it
        if self._next_decision is not None and done >= self._next_decision:
            self._rebalance(done)
        return output

    def _rebalance(self, done: int) -> None:
        """Gather every rank's measurement and frontier; from the agreed step on, shares from the new speeds."""
        schedule = self.schedule
        mine = torch.tensor([*self._interval.take(), *schedule.frontier], dtype=torch.float64)
        with self.clock.paused():  # the gather is no rank's own time
            rows = torch.stack(all_gather(mine)).tolist()
        speeds = self.estimator.update([row[0] for row in rows], [row[1] for row in rows])
        if speeds is None:  # some rank measured nothing yet
            self._next_decision = done + self.measure_steps
            return
        self._next_decision = done + self.rebalance_every if self.rebalance_every else None
        shares = tuple(apportion(schedule.global_batch, speeds, self.min_share))
        if shares == schedule.latest or not worth_changing(schedule.latest, shares, speeds, self.tolerance):
            return
        start = agreed_start([(row[3], row[4]) for row in rows])
        schedule.change(start, shares)
        self.share_changes.append(
            {"decided_after_step": done, "epoch": start[0], "step": start[1], "shares": list(shares), "speeds": speeds}
        )
        rank_zero_info(
            f"BalancedDataParallelStrategy: measured speeds {[round(s, 1) for s in speeds]} samples/s; shares "
            f"{list(shares)} of {schedule.global_batch} from epoch {start[0]} step {start[1]}"
        )

    # ------------------------------------------------------------------ epochs
    def on_epoch_start(self, trainer: pl.Trainer) -> None:
        if self.schedule is not None:
            self.schedule.compact((trainer.fit_loop.epoch_progress.current.processed, 0))
        self._epoch_meter.take()
        self.interrupt_cycle()

    def interrupt_cycle(self) -> None:
        """The ranks did something together (an epoch's end, validation): no rank's own time."""
        if self.clock is not None:
            self.clock.interrupt()

    def on_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Gather every rank's epoch and log it (rank 0's logs reach the loggers, and it has everyone's)."""
        if self.schedule is None or self._batch is None:
            return
        mine = torch.tensor(self._epoch_meter.take(), dtype=torch.float64)
        rows = torch.stack(all_gather(mine)).tolist()
        shares = self.schedule.shares_at(self._batch.epoch, self._batch.step)
        entry: dict[str, Any] = {
            "epoch": self._batch.epoch, "shares": list(shares), "samples": [row[0] for row in rows],
            "estimate": self.estimator.speeds,
        }
        for r, (samples, busy, wait) in enumerate(rows):
            speed = samples / busy if busy > 0 else 0.0
            for key, value in (("share", shares[r]), ("speed", speed), ("busy_s", busy), ("wait_s", wait)):
                pl_module.log(f"balanced/rank{r}/{key}", float(value), on_step=False, on_epoch=True)
                entry.setdefault(key, []).append(value)
        self.history.append(entry)

    # ------------------------------------------------------------------ checkpoints
    def balance_state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the schedule (shares in force and pending), speed estimates, next rebalancing."""
        assert self.schedule is not None
        return {
            "world_size": self.schedule.world_size, "global_batch": self.schedule.global_batch,
            "schedule": self.schedule.state_dict(), "speeds": self.estimator.state_dict(),
            "next_decision": self._next_decision,
        }

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        if self.schedule is not None:
            checkpoint[STATE_KEY] = self.balance_state()
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        self._restored = checkpoint.get(STATE_KEY)
        return checkpoint
