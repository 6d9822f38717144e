"""DelayedAveragingStrategy: ring all-reduce data parallelism whose exchange runs in the background and
is applied a fixed number of steps later.

Lightning glue only; the algorithms are :class:`lightning_hybrid.comm.delayed_averaging.DelayedGradientAveraging`
(``method="dga"``, the default) and :class:`lightning_hybrid.comm.delayed_allreduce.DelayedAllReduce`
(``method="pipe_sgd"``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.trainer.states import TrainerFn
from pytorch_lightning.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_hybrid.comm.delayed_allreduce import DelayedAllReduce, learning_rates, step_at, validate
from lightning_hybrid.comm.delayed_averaging import DelayedGradientAveraging
from lightning_hybrid.comm.regime import lanes
from lightning_hybrid.parameter_server.update_rule import MOMENTUM_CORRECTIONS, UpdateRule
from lightning_hybrid.strategies.checked_ddp import CheckedDDPStrategy
from lightning_hybrid.strategies.agreements import Agreement, Carried, EveryBatch
from lightning_hybrid.strategies.meeting import stop_if_agreed
from lightning_hybrid.strategies.refusals import refuse_grad_scaler, refuse_manual_optimization
from lightning_hybrid.strategies.replaced_step import ReplacedStep, unwrap_optimizer
from lightning_hybrid.strategies.clip_record import ClipRecord
from lightning_hybrid.strategies.even_batches import EvenBatches, even_batches
from lightning_hybrid.strategies.rank_states import RankStates

#: Where a checkpoint written between sync points keeps the pending averages and the model they are still to
#: be applied to (``method="pipe_sgd"``: the same on every rank): ``{"pending", "weights", "optimizer"}``.
PENDING_KEY = "lightning_hybrid_pending_averages"
METHODS = ("dga", "pipe_sgd")


def check_settings(method: str, delay: int, compensation: str | None, dc_lambda: float, bucket_size_mb: float,
                   warmup_steps: int, momentum_correction: str | None) -> str | None:
    """Raise a ValueError naming the setting that is wrong; return the momentum correction that applies."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS} (dga: each rank steps with its own gradient and corrects by "
                         f"the average later; pipe_sgd: only the average, applied late), got {method!r}")
    validate(delay, compensation, dc_lambda, bucket_size_mb)
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be a non-negative integer, got {warmup_steps!r}")
    if momentum_correction not in ("auto", None, *MOMENTUM_CORRECTIONS):
        raise ValueError(f"momentum_correction must be 'auto', None or one of {MOMENTUM_CORRECTIONS}, "
                         f"got {momentum_correction!r}")
    if method == "dga":
        if compensation is not None:
            raise ValueError(f"compensation={compensation!r} corrects a stale gradient applied late, which only "
                             "method='pipe_sgd' does; set method='pipe_sgd' (strategy.method=pipe_sgd) or compensation=None")
        if momentum_correction not in ("auto", None):
            raise ValueError(f"momentum_correction={momentum_correction!r} lowers the momentum for gradients applied "
                             "late (method='pipe_sgd'); under method='dga' every rank steps with its own gradient at "
                             "once: set momentum_correction='auto' (or None), or method='pipe_sgd'")
        return None
    return "subtract" if momentum_correction == "auto" else momentum_correction


class DelayedAveragingStrategy(RankStates, CheckedDDPStrategy):
    """Data parallelism whose gradient all-reduce runs in the background and is applied ``delay`` steps later.

    Each optimizer step starts the bucketed all-reduce of this rank's contribution with asynchronous
    collectives and uses the average that step ``t - delay`` started, so computation waits for the
    network only when the network is slower than ``delay`` steps of compute; a rank runs up to
    ``delay`` steps ahead of the slowest, blocking only on the oldest exchange. Two methods:

    * ``"dga"`` (default; delayed gradient averaging, Zhu et al. 2021): each rank steps with its own
      gradient at once, and when the average of step ``t - delay`` arrives it corrects its weights
      (with SGD, its momentum buffers too) as if that average had been its gradient then. The ranks
      differ only by their last ``delay`` gradients: DDP's sample efficiency, its network hidden.
      Exactly specified in :mod:`lightning_hybrid.comm.delayed_averaging`: for SGD (weights and momentum
      buffers), Adam and AdamW (weights and both moments: the average's wherever it is known), and the
      ranks' mean update for other optimizers.
    * ``"pipe_sgd"`` (Pipe-SGD, Li et al. 2018; Akintoye et al. 2022 combine ring all-reduce with
      asynchronous SGD): only the average is applied, ``delay`` steps late, optionally corrected by
      DC-ASGD (``compensation="dc"``) and with SGD's momentum lowered for the delay's own
      (``momentum_correction``). Measured (``benchmarks/slow_link.py``, LeNet-5 to 98 %) it needed 1.67x DDP's
      samples at ``delay=1``.

    ``delay=0`` is DDP under either method. Every average is applied exactly once; at sync points
    (before validation, at the end of each training epoch, so before checkpoints are written, and at
    the end of fitting) the pending ones are applied in order and every rank holds one model.

    Args:
        delay: optimizer steps between computing a gradient and applying its average.
        method: ``"dga"`` or ``"pipe_sgd"`` (see above).
        compensation: ``"pipe_sgd"`` only: ``None``, or ``"dc"`` to apply ``g + dc_lambda * g * g * (w_now - w_then)``
            (DC-ASGD, Zheng et al. 2017) where ``w_then`` are the weights the gradient was computed at.
        dc_lambda: DC-ASGD's lambda.
        bucket_size_mb: gradients are flattened into buckets of about this size, one collective each.
        warmup_steps: the first optimizer steps are synchronous (DDP's).
        momentum_correction: ``"pipe_sgd"`` only: ``"subtract"`` (what ``"auto"`` means there),
            ``"mean_delay"`` or ``None``: SGD's momentum lowered so that it and the delay's own implicit
            momentum together are what was configured (the rules of
            :mod:`lightning_hybrid.parameter_server.update_rule`, with a staleness of ``delay``):
            ``"subtract"`` removes ``delay / (1 + delay)`` (0.9 -> 0.4 at ``delay=1``), ``"mean_delay"``
            keeps the mean delay ``mu / (1 - mu)`` of an update (0.9 -> 0.889). Logged at setup.
            Under ``"dga"`` nothing is stale: ``"auto"`` (None) only.
        process_group_backend: ``None`` (nccl with one process per GPU, otherwise gloo) or a backend name.
        processes_per_device: processes started on each device the Trainer gives (``devices=1,
            processes_per_device=2``: two processes on one GPU, whose group then uses gloo).

    The exchange uses process groups of its own, enough that all ``delay`` exchanges in flight run at
    once (:meth:`exchange_lanes`: one gloo group runs two collectives at a time, and through a long link an
    all-reduce takes round trips), and it is the ranks' only meeting between sync points: a stop request (SIGTERM, ...) on any rank rides on its next exchange and every rank stops
    when that exchange is applied, at the same step (no collective of its own). Works with the
    optimizer and LR schedulers from ``configure_optimizers`` (every hyperparameter a schedule moves is
    recorded with its step), gradient clipping (the exchange starts before Lightning clips; each average is
    clipped as its step clipped the rank's own gradient, as DDP clips the average), accumulation, bf16
    precision, checkpoints and validate/test/predict. Every rank starts from rank 0's weights; a parameter no
    rank has a gradient for is not stepped; ranks whose data give different numbers of batches end the fit
    with one message naming them. Logged each step: ``asgd/compute_s`` (forward and backward),
    ``asgd/wait_s`` (blocked on communication) and ``asgd/bytes_sent`` (the bytes the step handed to
    its all-reduces). Each average is applied at the learning rates in force at the step that
    computed it (what DDP would have used). Under ``"pipe_sgd"`` the steps that apply pending averages
    at a sync point are optimizer steps Lightning does not count and do not advance LR schedulers.

    Checkpoints written between sync points (a stop, ``ModelCheckpoint(every_n_train_steps=N)``) hold
    what is in flight: under ``"dga"`` every rank's own weights, optimizer state and pending exchanges
    (gathered into rank 0's file: the ranks differ there), under ``"pipe_sgd"`` the pending averages; a
    run resumed from one continues as the original run does. Refused before workers start: manual
    optimization, fp16 with a gradient scaler. A ``delay`` of as many optimizer steps as an epoch has,
    or more (``fast_dev_run``'s one batch), is warned about: every average then waits for the epoch's
    sync point.

    Examples:
        >>> import pytorch_lightning as pl
        >>> from lightning_hybrid import DelayedAveragingStrategy
        >>> strategy = DelayedAveragingStrategy(delay=2)
        >>> trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False)
        >>> trainer.strategy.delay, trainer.strategy.method
        (2, 'dga')
        >>> # trainer.fit(model, datamodule=data)        or strategy="delayed_averaging" / "delayed_averaging_dc"
    """

    wraps_model = False  # no DDP wrapper (CheckedDDPStrategy.wraps_model)

    strategy_name = "delayed_averaging"
    aliases = {
        "delayed_averaging": ("All-reduce data parallelism, each rank's gradient at once and the average a step late "
                              "(delayed gradient averaging)", {}),
        "delayed_averaging_dc": ("The average alone applied a step late, with DC-ASGD compensation",
                                 {"method": "pipe_sgd", "compensation": "dc"}),
    }
    #: The default method is delayed gradient averaging, not asynchronous SGD: renamed with the class.
    renamed_aliases = {"allreduce_asgd": "delayed_averaging", "allreduce_asgd_dc": "delayed_averaging_dc"}
    #: Where a checkpoint keeps every rank's own state under ``method="dga"`` (:class:`RankStates`).
    rank_states_key = "lightning_hybrid_delayed_averaging"

    def __init__(
        self,
        delay: int = 1,
        method: str = "dga",
        compensation: str | None = None,
        dc_lambda: float = 0.04,
        bucket_size_mb: float = 25.0,
        warmup_steps: int = 0,
        momentum_correction: str | None = "auto",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._momentum_rule = check_settings(method, delay, compensation, dc_lambda, bucket_size_mb, warmup_steps,
                                             momentum_correction)
        self.delay, self.method, self.compensation, self.dc_lambda = delay, method, compensation, dc_lambda
        self.bucket_size_mb, self.warmup_steps, self.momentum_correction = bucket_size_mb, warmup_steps, momentum_correction
        self._configured_momentum: list[float | None] = []
        #: ``method="dga"``: the algorithm of this fit.
        self.averaging: DelayedGradientAveraging | None = None
        #: ``method="pipe_sgd"``: the exchange of this fit.
        self.exchange: DelayedAllReduce | None = None
        self._carried: Carried | None = None
        self._steps = 0
        #: Averages started (one per optimizer step) and applied, over the whole fit.
        self.pushed = 0
        self.applied = 0
        self._restored_pending: list[dict] | None = None  # pipe_sgd: from a checkpoint written between sync points
        self._restored_live: dict[str, Any] | None = None  # pipe_sgd: that checkpoint's model before its pending averages
        self._clips: ClipRecord | None = None
        self._even: EvenBatches | None = None

    # ------------------------------------------------------------------ checks
    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        """Refuse what the strategy cannot run (called before the other processes start)."""
        refuse_manual_optimization("DelayedAveragingStrategy", model, "it replaces the optimizer step")
        refuse_grad_scaler("DelayedAveragingStrategy", self.precision_plugin)

    # ------------------------------------------------------------------ checkpoints between sync points
    def ranks_differ(self) -> bool:
        """Under DGA the ranks differ while an exchange is in flight (the same count on every rank)."""
        return self.averaging is not None and self.averaging.pending > 0

    def own_state(self) -> Any:
        assert self.averaging is not None
        return self.averaging.state_dict()

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """A checkpoint written between sync points also holds what is in flight (see the class docstring),
        and at its top level the model a sync point would give every rank now (rank 0's with its pending
        averages applied), so that it loads as the run's model anywhere."""
        pending = (self.averaging is not None and self.averaging.pending) or (self.exchange is not None and self.exchange.pending)
        if pending and self.is_global_zero:
            live = checkpoint
            checkpoint = self._settled(checkpoint)
            if self.exchange is not None:
                checkpoint[PENDING_KEY] = {"pending": self.exchange.pending_state(), "weights": live["state_dict"],
                                           "optimizer": live["optimizer_states"][0]}
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def _settled(self, checkpoint: dict[str, Any]) -> dict[str, Any]:
        """``checkpoint`` with the weights and optimizer state this rank holds once its pending averages are applied."""
        optimizer = unwrap_optimizer(self.optimizers[0])
        if self.averaging is not None:
            weights, states = self.averaging.settled()
            optimizer_state = optimizer.state_dict()
            order = [p for group in optimizer.param_groups for p in group["params"]]
            optimizer_state["state"] = {i: states[p] for i, p in enumerate(order) if states[p]}
        else:
            flat_weights, optimizer_state = self.exchange.settled(optimizer)
            weights = dict(zip(self.exchange.params, flat_weights))
        names = {p: name for name, p in self.lightning_module.named_parameters()}
        state_dict = dict(checkpoint["state_dict"])
        state_dict.update({names[p]: w.detach().cpu() for p, w in weights.items() if p in names})
        return {**checkpoint, "state_dict": state_dict,
                "optimizer_states": [optimizer_state, *checkpoint.get("optimizer_states", [])[1:]]}

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        saved = checkpoint.pop(PENDING_KEY, None)
        saved = {"pending": saved} if isinstance(saved, list) else saved  # before 2026-11-29: the top level was live
        self._restored_pending = saved["pending"] if saved else None
        self._restored_live = saved if saved and "weights" in saved else None
        return checkpoint

    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        """A ``pipe_sgd`` checkpoint written between sync points resumes from the model its pending averages
        are still to be applied to (its top level holds them applied)."""
        if self._restored_live is not None:
            checkpoint = {**checkpoint, "state_dict": self._restored_live["weights"]}
        super().load_model_state_dict(checkpoint, strict=strict)

    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        if self._restored_live is not None:
            checkpoint = {**checkpoint, "optimizer_states": [self._restored_live["optimizer"]]}
        super().load_optimizer_state_dict(checkpoint)

    def on_epoch_start(self, trainer: pl.Trainer) -> None:
        """Every rank's loader gives as many batches (where known)."""
        if self._even is not None:
            self._even.check_lengths(trainer)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self._even is not None:
            self._even.on_batch()
        super().on_train_batch_start(batch, batch_idx)

    def on_sync_start(self, trainer: pl.Trainer) -> None:
        """Warn of a delay that an epoch cannot fill (its length is known only now)."""
        steps = trainer.num_training_batches / max(trainer.accumulate_grad_batches, 1)
        if self.delay >= steps:
            cause = "fast_dev_run" if trainer.fast_dev_run else "the epoch's length (limit_train_batches, the data)"
            rank_zero_warn(
                f"DelayedAveragingStrategy(delay={self.delay}) is not shorter than an epoch ({steps:g} optimizer steps, "
                f"set by {cause}): every average is applied at the epoch's sync point, none during the epoch."
            )

    # ------------------------------------------------------------------ setup
    _extra_lanes: list[Any] | None = None  # the exchange's groups after the first (exchange_lanes)

    def exchange_lanes(self) -> list[Any]:
        """The exchange's process groups: enough that all ``delay`` exchanges in flight run at once
        (:func:`~lightning_hybrid.comm.regime.lanes`: gloo runs two of a group's collectives at once, NCCL
        one); the first is :attr:`exchange_group`. Made once, on every rank (a collective call)."""
        backend = self._get_process_group_backend()
        count = lanes(self.delay, backend)
        if self._extra_lanes is None:
            self._extra_lanes = []
        while len(self._extra_lanes) < count - 1:
            self._extra_lanes.append(torch.distributed.new_group(backend=backend))
        return [self.exchange_group, *self._extra_lanes[: count - 1]]

    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        optimizer, params = self.setup_exchange(trainer)
        self._steps = self.pushed = self.applied = 0
        self._configured_momentum = [group.get("momentum") for group in optimizer.param_groups]
        self._clips = ClipRecord(self.precision_plugin)
        self._even = even_batches(self)
        lanes = self.exchange_lanes()
        if self.method == "dga":
            self.averaging = DelayedGradientAveraging(unwrap_optimizer(optimizer), self.delay, self.bucket_size_mb,
                                                      group=lanes, while_waiting=self._even.while_waiting)
            if self.restored is not None and self.restored["own"] is not None:  # resumed between sync points
                self.averaging.load_state_dict(self.restored["own"])
                self.pushed = self.averaging.pending
        else:
            self.exchange = DelayedAllReduce(params, self.delay, self.bucket_size_mb, group=lanes,
                                             compensation=self.compensation, dc_lambda=self.dc_lambda,
                                             while_waiting=self._even.while_waiting)
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
        if not self.delay or self._momentum_rule is None:
            return
        rule = UpdateRule(momentum_correction=self._momentum_rule)
        rule.mean_staleness = float(self.delay)
        for group, configured in zip(optimizer.param_groups, self._configured_momentum):
            if configured:
                group["momentum"] = rule.momentum(configured)
                rank_zero_info(f"DelayedAveragingStrategy: a delay of {self.delay} step(s) adds momentum of its own; SGD's "
                               f"momentum {configured:g} -> {group['momentum']:.4g} (momentum_correction="
                               f"{self._momentum_rule}; None keeps {configured:g})")

    def stop_agreement(self, trainer: pl.Trainer) -> Agreement:
        """The ranks meet only at their exchanges: a stop request rides on the next one, and is agreed
        when that exchange is applied (``delay`` steps after the request at most)."""
        self._carried = Carried() if trainer.state.fn == TrainerFn.FITTING else None
        return self._carried or EveryBatch()

    # ------------------------------------------------------------------ the step
    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        if self.exchange is None and self.averaging is None:
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        model = model or self.lightning_module
        start = time.perf_counter()
        unwrapped = unwrap_optimizer(optimizer)

        def exchanging_closure() -> Any:
            """Forward and backward, then this step's exchange started before Lightning clips the gradients (DDP
            clips the average); a synchronous step's average in ``.grad`` before clipping and the hooks."""
            result = closure()
            self._compute_s = time.perf_counter() - start
            self._waited_s, self._sent = self._exchange.wait_s, self._exchange.bytes_sent
            self._start_exchange(unwrapped)
            return result

        step = ReplacedStep(unwrapped, self._step)
        return self.precision_plugin.optimizer_step(step, model=model, closure=exchanging_closure, **kwargs)

    @property
    def _exchange(self) -> DelayedAllReduce:
        exchange = self.averaging.exchange if self.averaging is not None else self.exchange
        assert exchange is not None
        return exchange

    @property
    def _synchronous(self) -> bool:
        """This step is DDP's: a warm-up step, or every step at ``delay=0``."""
        return self._steps < self.warmup_steps or self.delay == 0

    def _start_exchange(self, optimizer: torch.optim.Optimizer) -> None:
        stop = self.requested_stop()
        if self.averaging is not None:
            self.averaging.exchange_gradients(stop=stop, synchronous=self._synchronous)
            return
        self.exchange.push(learning_rates(optimizer), stop=stop)  # applied later at this step's rates
        if self._synchronous:
            for _ in self.exchange.drain_into_grads():  # this step's average, at once (nothing else is pending)
                pass

    def _step(self, optimizer: torch.optim.Optimizer) -> None:
        """In place of the optimizer's step, after Lightning clipped the gradients."""
        assert self._carried is not None and self._clips is not None
        exchange, clip = self._exchange, self._clips.take()
        if self.averaging is not None:
            self.averaging.step(stop=self.requested_stop(), synchronous=self._synchronous, clip=clip)
            self.applied = self.averaging.applied
        elif self._synchronous:
            optimizer.step()  # the average, clipped by Lightning
            self.applied += 1
        else:
            exchange.clip_newest(clip)
            if exchange.load_ready_into_grads():
                step_at(optimizer, exchange.loaded_lrs)
                self.applied += 1
        self.pushed += 1
        self._steps += 1
        self._carried.heard(exchange.stop)
        module = self.lightning_module
        module.log("asgd/compute_s", self._compute_s, on_step=True, on_epoch=False)
        module.log("asgd/wait_s", exchange.wait_s - self._waited_s, on_step=True, on_epoch=False)
        module.log("asgd/bytes_sent", float(exchange.bytes_sent - self._sent), on_step=True, on_epoch=False)

    def sync_point(self) -> None:
        """Apply every pending average, oldest first; every rank then holds one model (all ranks call this
        at the same point, after agreeing that they trained as many batches)."""
        if self._even is not None and (self.averaging is not None or self.exchange is not None):
            self._exchange.pending_items()  # waited for (their partners were started): a stop they carry is heard
            self._carried.heard(self._exchange.stop)
            stop_if_agreed(self, self._carried)
            self._even.agree()
        if self.averaging is not None:
            self.averaging.sync()
            self.applied = self.averaging.applied
            self._carried.heard(self.averaging.stop)
        elif self.exchange is not None:
            self.applied += self.exchange.apply_pending(self.optimizers[0])
            self._carried.heard(self.exchange.stop)

    def on_sync_end(self) -> None:
        self.sync_point()
        if self._even is not None:
            self._even.finish()  # the last sync point read everywhere before rank 0 (the store's host) may end

    def teardown(self) -> None:
        optimizers = self.optimizers or []
        if optimizers and self._configured_momentum:  # the user's optimizer as it was configured
            for group, configured in zip(unwrap_optimizer(optimizers[0]).param_groups, self._configured_momentum):
                if configured is not None:
                    group["momentum"] = configured
        self.exchange = self.averaging = None
        self.restored = self._clips = self._even = self._restored_live = None
        super().teardown()
