# Generated from lightning_hybrid/strategies/allreduce_asgd.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""AllReduceASGDStrategy: ring all-reduce data parallelism whose gradients are applied with a delay.

Lightning glue only; the algorithm is :class:`lightning_hybrid.comm.DelayedAllReduce`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_hybrid.comm.delayed_allreduce import DelayedAllReduce, learning_rates, step_at, validate
from lightning_hybrid.parameter_server.update_rule import MOMENTUM_CORRECTIONS, UpdateRule
from lightning_hybrid.lightning.strategies import common
from lightning_hybrid.lightning.strategies.meeting import Agreement, Deferred, EveryBatch


#: Where a checkpoint written between sync points keeps the pending averages.
PENDING_KEY = "lightning_hybrid_pending_averages"


class AllReduceASGDStrategy(common.UnwrappedDDPStrategy):
    """Data parallelism whose gradient all-reduce runs in the background and is applied ``delay`` steps later.

    Each optimizer step computes this rank's gradients, starts their bucketed all-reduce with
    asynchronous collectives, and applies the average that step ``t - delay`` started (none while
    the pipeline fills), so computation never waits for the network unless the network is slower
    than ``delay`` steps of compute (Pipe-SGD; Akintoye et al. 2022 combine ring all-reduce with
    asynchronous SGD). Every average is applied exactly once; at sync points (before validation, at
    the end of each training epoch, so before checkpoints are written, and at the end of fitting)
    the pending ones are applied in order. ``delay=0`` is DDP.

    Args:
        delay: optimizer steps between computing a gradient and applying its average.
        compensation: ``None``, or ``"dc"`` to apply ``g + dc_lambda * g * g * (w_now - w_then)``
            (DC-ASGD, Zheng et al. 2017) where ``w_then`` are the weights the gradient was computed at.
        dc_lambda: DC-ASGD's lambda.
        bucket_size_mb: gradients are flattened into buckets of about this size, one collective each.
        warmup_steps: the first optimizer steps are synchronous (applied at once).
        momentum_correction: ``"subtract"`` (default), ``"mean_delay"`` or ``None``: SGD's momentum lowered
            so that it and the delay's own implicit momentum together are what was configured (the rules
            of :mod:`lightning_hybrid.parameter_server.update_rule`, with a staleness of ``delay``):
            ``"subtract"`` removes ``delay / (1 + delay)`` (0.9 -> 0.4 at ``delay=1``), ``"mean_delay"``
            keeps the mean delay ``mu / (1 - mu)`` of an update (0.9 -> 0.889: too little here). Logged
            at setup. Measured (``benchmarks/slow_link.py``, LeNet-5 to 98 %, momentum 0.9, 3 seeds):
            ``"subtract"`` reached it in every run at every rate of the sweep (131,072 samples, median;
            DDP 65,536); at their best rate ``None`` needed 1.5x its samples and ``"mean_delay"`` missed it
            in one seed of three.
        process_group_backend: ``None`` (nccl with one process per GPU, otherwise gloo) or a backend name.
        processes_per_device: processes started on each device the Trainer gives (``devices=1,
            processes_per_device=2``: two processes on one GPU, whose group then uses gloo).

    The exchange uses a process group of its own. Works with the optimizer and LR schedulers from
    ``configure_optimizers``, gradient clipping (of each rank's gradient, before the exchange),
    accumulation, bf16 precision, checkpoints (at epoch ends nothing is pending) and
    validate/test/predict. Logged each step: ``asgd/compute_s`` (forward and backward),
    ``asgd/wait_s`` (blocked on communication) and ``asgd/bytes_sent`` (the gradient bytes the step
    handed to its all-reduces). The steps that apply pending averages at a sync
    point are optimizer steps Lightning does not count and do not advance LR schedulers. Each
    average is applied at the learning rates in force at the step that computed it (what DDP would
    have used), not those in force when it arrives: an epoch-interval scheduler's change at the end
    of an epoch does not reach the averages flushed at that epoch's sync point.

    Checkpoints written between sync points (``ModelCheckpoint(every_n_train_steps=N)``) hold the
    averages still pending (waited for, oldest first); a run resumed from one applies them at the
    steps the original run does. Refused before workers start: manual optimization, fp16 with a
    gradient scaler. A ``delay`` of as many optimizer steps as an epoch has, or more
    (``fast_dev_run``'s one batch), is warned about: every average then waits for the epoch's sync point.

    Examples:
        >>> import lightning.pytorch as pl
        >>> from lightning_hybrid import AllReduceASGDStrategy
        >>> strategy = AllReduceASGDStrategy(delay=1, compensation="dc")
        >>> trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False)
        >>> trainer.strategy.delay, trainer.strategy.compensation
        (1, 'dc')
        >>> # trainer.fit(model, datamodule=data)        or strategy="allreduce_asgd" / "allreduce_asgd_dc"
    """

    strategy_name = "allreduce_asgd"
    aliases = {
        "allreduce_asgd": ("All-reduce data parallelism with gradients applied one step late", {}),
        "allreduce_asgd_dc": ("Delayed all-reduce with DC-ASGD compensation", {"compensation": "dc"}),
    }

    def __init__(
        self,
        delay: int = 1,
        compensation: str | None = None,
        dc_lambda: float = 0.04,
        bucket_size_mb: float = 25.0,
        warmup_steps: int = 0,
        momentum_correction: str | None = "subtract",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        validate(delay, compensation, dc_lambda, bucket_size_mb)
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be a non-negative integer, got {warmup_steps!r}")
        self.delay = delay
        self.compensation = compensation
        self.dc_lambda = dc_lambda
        self.bucket_size_mb = bucket_size_mb
        self.warmup_steps = warmup_steps
        if momentum_correction not in (None, *MOMENTUM_CORRECTIONS):
            raise ValueError(f"momentum_correction must be None or one of {MOMENTUM_CORRECTIONS}, got {momentum_correction!r}")
        self.momentum_correction = momentum_correction
        self._configured_momentum: list[float | None] = []
        #: Simulated latency added to each collective (set by lightning_hybrid.sim).
        self.collective_latency_s = 0.0
        self.exchange: DelayedAllReduce | None = None
        self._steps = 0
        #: Averages started (one per optimizer step) and applied, over the whole fit.
        self.pushed = 0
        self.applied = 0
        self._restored_pending: list[dict] | None = None  # from a checkpoint written between sync points

    # ------------------------------------------------------------------ checks
    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        """Refuse what the strategy cannot run (called before the other processes start)."""
        common.refuse_manual_optimization("AllReduceASGDStrategy", model, "it replaces the optimizer step")
        common.refuse_grad_scaler("AllReduceASGDStrategy", self.precision_plugin)

    # ------------------------------------------------------------------ checkpoints between sync points
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """A checkpoint written between sync points (``every_n_train_steps``) also holds the averages
        still pending, so that a run resumed from it applies them as the original run does."""
        if self.exchange is not None and self.exchange.pending and self.is_global_zero:
            checkpoint = {**checkpoint, PENDING_KEY: self.exchange.pending_state()}
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        self._restored_pending = checkpoint.pop(PENDING_KEY, None)
        return checkpoint

    def on_sync_start(self, trainer: pl.Trainer) -> None:
        """Warn of a delay that an epoch cannot fill (its length is known only now)."""
        steps = trainer.num_training_batches / max(trainer.accumulate_grad_batches, 1)
        if self.delay >= steps:
            cause = "fast_dev_run" if trainer.fast_dev_run else "the epoch's length (limit_train_batches, the data)"
            rank_zero_warn(
                f"AllReduceASGDStrategy(delay={self.delay}) is not shorter than an epoch ({steps:g} optimizer steps, "
                f"set by {cause}): every average is applied at the epoch's sync point, none during the epoch."
            )

    def inject_collective_latency(self, seconds: float) -> None:
        """Add ``seconds`` to every collective of the exchange (heterogeneity simulation)."""
        if not seconds >= 0:
            raise ValueError(f"collective latency must be non-negative, got {seconds}")
        self.collective_latency_s = float(seconds)

    # ------------------------------------------------------------------ setup
    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        optimizer, params = self.setup_exchange(trainer)
        self.exchange = DelayedAllReduce(
            params, self.delay, self.bucket_size_mb, group=self.exchange_group, compensation=self.compensation,
            dc_lambda=self.dc_lambda, latency_s=self.collective_latency_s,
        )
        self._steps = self.pushed = self.applied = 0
        self._correct_momentum(optimizer)
        if self._restored_pending:  # resumed between sync points: the averages the checkpoint held
            self.exchange.load_pending_state(self._restored_pending)
            self.pushed = len(self._restored_pending)
            self._restored_pending = None
        self.attach_sync_points(trainer)

    def _correct_momentum(self, optimizer: torch.optim.Optimizer) -> None:
        """A gradient applied ``delay`` steps late acts as ``delay`` steps of momentum of its own (the
        implicit momentum of asynchrony, Mitliagkas et al. 2016): lower SGD's explicit momentum so that
        the two together are what the user configured (``momentum_correction``), and say so."""
        self._configured_momentum = [group.get("momentum") for group in optimizer.param_groups]
        if not self.delay or self.momentum_correction is None:
            return
        rule = UpdateRule(momentum_correction=self.momentum_correction)
        rule.mean_staleness = float(self.delay)
        for group, configured in zip(optimizer.param_groups, self._configured_momentum):
            if configured:
                group["momentum"] = rule.momentum(configured)
                rank_zero_info(f"AllReduceASGDStrategy: a delay of {self.delay} step(s) adds momentum of its own; SGD's "
                               f"momentum {configured:g} -> {group['momentum']:.4g} (momentum_correction="
                               f"{self.momentum_correction}; None keeps {configured:g})")

    def stop_agreement(self, trainer: pl.Trainer) -> Agreement:
        """A stop agreed once the delay has passed: agreeing on it in the batch would make a fast rank
        wait for the slowest at every batch, which the delay is there to avoid."""
        if trainer.state.fn != TrainerFn.FITTING:
            return EveryBatch()
        return Deferred(lag=(self.delay + 1) * max(trainer.accumulate_grad_batches, 1))

    # ------------------------------------------------------------------ the step
    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        if self.exchange is None:
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        model = model or self.lightning_module
        start = time.perf_counter()

        def timed_closure() -> Any:
            result = closure()
            self._compute_s = time.perf_counter() - start
            return result

        step = common.ReplacedStep(common.unwrap_optimizer(optimizer), self._exchange_and_step)
        return self.precision_plugin.optimizer_step(step, model=model, closure=timed_closure, **kwargs)

    def _exchange_and_step(self, optimizer: torch.optim.Optimizer) -> None:
        exchange = self.exchange
        waited, sent = exchange.wait_s, exchange.bytes_sent
        exchange.push(learning_rates(optimizer))  # applied later at this step's learning rates
        self.pushed += 1
        if self._steps < self.warmup_steps:
            for _ in exchange.drain_into_grads():  # synchronous: this step's average, at once
                step_at(optimizer, exchange.loaded_lrs)
                self.applied += 1
        elif exchange.load_ready_into_grads():
            step_at(optimizer, exchange.loaded_lrs)
            self.applied += 1
        self._steps += 1
        module = self.lightning_module
        module.log("asgd/compute_s", self._compute_s, on_step=True, on_epoch=False)
        module.log("asgd/wait_s", exchange.wait_s - waited, on_step=True, on_epoch=False)
        module.log("asgd/bytes_sent", float(exchange.bytes_sent - sent), on_step=True, on_epoch=False)

    def sync_point(self) -> None:
        """Apply every pending average, oldest first (all ranks call this at the same point)."""
        if self.exchange is None:
            return
        self.applied += self.exchange.apply_pending(self.optimizers[0])

    def on_sync_end(self) -> None:
        self.sync_point()

    def teardown(self) -> None:
        optimizers = self.optimizers or []
        if optimizers and self._configured_momentum:  # the user's optimizer as it was configured
            for group, configured in zip(common.unwrap_optimizer(optimizers[0]).param_groups, self._configured_momentum):
                if configured is not None:
                    group["momentum"] = configured
        if self.exchange is not None:
            self.exchange.close()
            self.exchange = None
        super().teardown()
