# Generated from lightning_hybrid/strategies/local_sgd.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""LocalSGDStrategy: each rank trains on its own for ``sync_every`` steps; an outer optimizer moves the
shared weights by the ranks' average progress (DiLoCo), the averaging overlapped and streamed.

Lightning glue only; the algorithm (exactly specified there) is :class:`lightning_hybrid.comm.outer_rounds.LocalSGD`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lightning_hybrid.comm.outer_rounds import LocalSGD, validate
from lightning_hybrid.lightning.strategies.checked_ddp import CheckedDDPStrategy
from lightning_hybrid.strategies.agreements import Agreement, Carried, EveryBatch
from lightning_hybrid.lightning.strategies.meeting import stop_if_agreed
from lightning_hybrid.lightning.strategies.refusals import refuse_grad_scaler, refuse_manual_optimization
from lightning_hybrid.lightning.strategies.even_batches import EvenBatches, even_batches
from lightning_hybrid.strategies.rank_states import RankStates



class LocalSGDStrategy(RankStates, CheckedDDPStrategy):
    """Local SGD with an outer optimizer: the ranks exchange a model-sized average every ``sync_every``
    optimizer steps instead of every step (DiLoCo, Douillard et al. 2023; Streaming DiLoCo with
    ``fragments``), ``delay`` rounds late so that the exchange overlaps the next rounds' compute.

    Each rank steps its own copy of the model with the optimizer from ``configure_optimizers`` (the
    inner optimizer) on its share of the data. After ``sync_every`` steps the ranks average how far
    each moved since the round began, and the outer optimizer (``"nesterov"``: SGD with Nesterov
    momentum, DiLoCo's; ``"average"``: plain averaging) moves the shared weights by it; every rank
    continues from them. With ``sync_every=1, outer_optimizer="average"`` this is
    :class:`~lightning_hybrid.DelayedAveragingStrategy` of the same ``delay`` with ``method="pipe_sgd",
    momentum_correction=None`` (for SGD: the average alone, applied late, the momentum as configured), and with
    ``delay=0`` DDP; a round sends one model-sized average, so ``sync_every=H`` sends ``H`` times fewer bytes than
    DDP (half that again with ``wire_dtype="bf16"``).

    Args:
        sync_every: optimizer steps per round (``H``).
        delay: rounds between ending a round and applying its average (0, the default: at once; 1: overlapped
            with the next round, which with SGD's momentum 0.9 inside stalled below 98 % on LeNet-5,
            ``docs/strategies/local-sgd.md``).
        outer_optimizer: ``"average"`` (default: the shared weights move by the mean pseudo-gradient) or
            ``"nesterov"`` (DiLoCo's: SGD with Nesterov momentum on the pseudo-gradient). Measured
            (``benchmarks/slow_link.py``, LeNet-5, inner SGD with momentum 0.9): DiLoCo's 0.7 / 0.9
            diverged at ``sync_every`` 32 (0.10 after 4 epochs, plain averaging 0.98); it was
            tuned for AdamW inside and rounds of hundreds of steps.
        outer_lr, outer_momentum: the Nesterov outer optimizer's rate and momentum (DiLoCo: 0.7, 0.9).
        fragments: the model cut into this many parts of about equal bytes, synchronised in turn,
            ``sync_every / fragments`` steps apart (Streaming DiLoCo); must divide ``sync_every``.
        wire_dtype: ``"fp32"`` or ``"bf16"``: the averages' dtype on the wire.
        process_group_backend, processes_per_device, fork_ranks: as every strategy of the suite.

    At sync points (before validation, at each epoch's end, so before checkpoints, and at the end of
    fitting) every fragment ends its round early and every pending average is applied: validation and
    checkpoints see the shared weights. Checkpoints hold the outer optimizers' state, the averages
    still pending, and every rank's own weights and inner optimizer state (gathered to rank 0's
    file), so a run resumed from one written mid-epoch (a stop) continues exactly. Logged each step:
    ``local_sgd/bytes_sent`` (the pseudo-gradients this rank's step handed to an all-reduce: 0 inside a
    round) and ``local_sgd/wait_s`` (the step's time blocked on averages).
    Refused before workers start: manual optimization, fp16 with a gradient scaler.

    Examples:
        >>> import lightning.pytorch as pl
        >>> from lightning_hybrid import LocalSGDStrategy
        >>> strategy = LocalSGDStrategy(sync_every=32)  # delay=0, plain averaging: delay=1 stalled below 98 % here
        >>> trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False)
        >>> trainer.strategy.sync_every, trainer.strategy.delay
        (32, 0)
        >>> # trainer.fit(model, datamodule=data)        or strategy="local_sgd"
    """

    wraps_model = False  # no DDP wrapper (CheckedDDPStrategy.wraps_model)

    strategy_name = "local_sgd"
    #: Where a checkpoint keeps LocalSGD's state and every rank's own weights and inner optimizer state.
    rank_states_key = "lightning_hybrid_local_sgd"
    aliases = {"local_sgd": ("Local SGD: the ranks' progress averaged every 32 steps (DiLoCo's outer optimizer as an "
                             "option)", {})}
    resumes_mid_epoch = True

    def __init__(self, sync_every: int = 32, delay: int = 0, outer_optimizer: str = "average", outer_lr: float = 0.7,
                 outer_momentum: float = 0.9, fragments: int = 1, wire_dtype: str = "fp32", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        validate(sync_every, delay, outer_optimizer, outer_lr, outer_momentum, fragments, wire_dtype)
        self.sync_every, self.delay, self.fragments, self.wire_dtype = sync_every, delay, fragments, wire_dtype
        self.outer_optimizer, self.outer_lr, self.outer_momentum = outer_optimizer, outer_lr, outer_momentum
        self.local: LocalSGD | None = None
        self._carried: Carried | None = None
        self._even: EvenBatches | None = None

    # ------------------------------------------------------------------ checks
    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        refuse_manual_optimization("LocalSGDStrategy", model, "it steps every rank's own optimizer itself")
        refuse_grad_scaler("LocalSGDStrategy", self.precision_plugin)

    def stop_agreement(self, trainer: pl.Trainer) -> Agreement:
        """The ranks meet only at a round's end: a stop request rides on the round's average and is
        agreed when the average is applied (``sync_every * (delay + 1)`` steps at most)."""
        self._carried = Carried() if trainer.state.fn == TrainerFn.FITTING else None
        return self._carried or EveryBatch()

    # ------------------------------------------------------------------ setup
    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        _, params = self.setup_exchange(trainer)
        self._even = even_batches(self)
        self.local = LocalSGD(params, self.sync_every, self.delay, self.outer_optimizer, self.outer_lr,
                              self.outer_momentum, self.fragments, self.wire_dtype, group=self.exchange_group,
                              while_waiting=self._even.while_waiting)
        if self.restored is not None:
            self.local.load_state_dict(self.restored["shared"])
        self.attach_sync_points(trainer)

    def on_sync_start(self, trainer: pl.Trainer) -> None:
        steps = trainer.num_training_batches / max(trainer.accumulate_grad_batches, 1)
        if self.sync_every > steps:
            rank_zero_warn(f"LocalSGDStrategy(sync_every={self.sync_every}) is longer than an epoch ({steps:g} optimizer "
                           "steps): every round ends early at the epoch's sync point")

    def on_epoch_start(self, trainer: pl.Trainer) -> None:
        """Every rank's loader gives as many batches (where known)."""
        if self._even is not None:
            self._even.check_lengths(trainer)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self._even is not None:
            self._even.on_batch()
        super().on_train_batch_start(batch, batch_idx)

    # ------------------------------------------------------------------ the step
    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        result = super().optimizer_step(optimizer, closure, model, **kwargs)
        if self.local is not None:
            sent, waited = self.local.bytes_sent, self.local.wait_s
            self.local.after_inner_step(stop=self.requested_stop())
            self._carried.heard(self.local.stop)
            module = self.lightning_module
            module.log("local_sgd/bytes_sent", float(self.local.bytes_sent - sent), on_step=True, on_epoch=False)
            module.log("local_sgd/wait_s", self.local.wait_s - waited, on_step=True, on_epoch=False)
        return result

    def sync_point(self) -> None:
        """End every round early, apply every pending average: every rank holds the shared weights (after the
        ranks agreed that they trained as many batches)."""
        if self.local is not None:
            self._carried.heard(self.local.pending_stop())
            stop_if_agreed(self, self._carried)
            self._even.agree()
            self.local.sync(stop=self.requested_stop())
            self._carried.heard(self.local.stop)

    def on_sync_end(self) -> None:
        self.sync_point()
        if self._even is not None:
            self._even.finish()  # the last sync point read everywhere before rank 0 (the store's host) may end

    # ------------------------------------------------------------------ checkpoints (RankStates)
    def ranks_differ(self) -> bool:
        return self.local is not None

    def shared_state(self) -> Any:
        assert self.local is not None
        return self.local.state_dict()

    def teardown(self) -> None:
        self.local = self._even = None
        self.restored = None
        super().teardown()
