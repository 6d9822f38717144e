# Generated from lightning_hybrid/strategies/local_sgd.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""LocalSGDStrategy: each rank trains on its own for ``sync_every`` steps; an outer optimizer moves the
shared weights by the ranks' average progress (DiLoCo), the averaging overlapped and streamed.

Lightning glue only; the algorithm (exactly specified there) is :class:`lightning_hybrid.comm.local_sgd.LocalSGD`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lightning_hybrid.comm.collectives import all_gather_object
from lightning_hybrid.comm.local_sgd import LocalSGD, validate
from lightning_hybrid.lightning.strategies import common
from lightning_hybrid.lightning.strategies.meeting import Agreement, Deferred, EveryBatch

#: Where a checkpoint keeps LocalSGD's state and every rank's own weights and inner optimizer state.
STATE_KEY = "lightning_hybrid_local_sgd"


class LocalSGDStrategy(common.UnwrappedDDPStrategy):
    """Local SGD with an outer optimizer: the ranks exchange a model-sized average every ``sync_every``
    optimizer steps instead of every step (DiLoCo, Douillard et al. 2023; Streaming DiLoCo with
    ``fragments``), ``delay`` rounds late so that the exchange overlaps the next rounds' compute.

    Each rank steps its own copy of the model with the optimizer from ``configure_optimizers`` (the
    inner optimizer) on its share of the data. After ``sync_every`` steps the ranks average how far
    each moved since the round began, and the outer optimizer (``"nesterov"``: SGD with Nesterov
    momentum, DiLoCo's; ``"average"``: plain averaging) moves the shared weights by it; every rank
    continues from them. With ``sync_every=1, outer_optimizer="average"`` this is
    :class:`~lightning_hybrid.AllReduceASGDStrategy` of the same ``delay`` (for SGD), and with ``delay=0``
    DDP; a round sends one model-sized average, so ``sync_every=H`` sends ``H`` times fewer bytes than
    DDP (half that again with ``wire_dtype="bf16"``).

    Args:
        sync_every: optimizer steps per round (``H``).
        delay: rounds between ending a round and applying its average (0: at once; 1: overlapped with
            the next round).
        outer_optimizer: ``"average"`` (default: the shared weights move by the mean pseudo-gradient) or
            ``"nesterov"`` (DiLoCo's: SGD with Nesterov momentum on the pseudo-gradient). Measured
            (``benchmarks/slow_link.py``, LeNet-5, inner SGD with momentum 0.9): DiLoCo's 0.7 / 0.9
            diverged at ``sync_every`` 8 (chance accuracy after an epoch, plain averaging 97 %); it was
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
        >>> strategy = LocalSGDStrategy(sync_every=32, delay=1)
        >>> trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False)
        >>> trainer.strategy.sync_every, trainer.strategy.delay
        (32, 1)
        >>> # trainer.fit(model, datamodule=data)        or strategy="local_sgd"
    """

    strategy_name = "local_sgd"
    aliases = {"local_sgd": ("Local SGD with a Nesterov outer optimizer (DiLoCo): an average every 32 steps", {})}
    resumes_mid_epoch = True

    def __init__(self, sync_every: int = 32, delay: int = 0, outer_optimizer: str = "average", outer_lr: float = 0.7,
                 outer_momentum: float = 0.9, fragments: int = 1, wire_dtype: str = "fp32", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        validate(sync_every, delay, outer_optimizer, outer_lr, outer_momentum, fragments, wire_dtype)
        self.sync_every, self.delay, self.fragments, self.wire_dtype = sync_every, delay, fragments, wire_dtype
        self.outer_optimizer, self.outer_lr, self.outer_momentum = outer_optimizer, outer_lr, outer_momentum
        self.local: LocalSGD | None = None
        self._restored: dict[str, Any] | None = None  # from a checkpoint: LocalSGD's state and this rank's own

    # ------------------------------------------------------------------ checks
    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        common.refuse_manual_optimization("LocalSGDStrategy", model, "it steps every rank's own optimizer itself")
        common.refuse_grad_scaler("LocalSGDStrategy", self.precision_plugin)

    def stop_agreement(self, trainer: pl.Trainer) -> Agreement:
        """Agreed a batch late, in the background: the ranks meet only at a round's end."""
        return Deferred(lag=max(trainer.accumulate_grad_batches, 1)) if trainer.state.fn == TrainerFn.FITTING \
            else EveryBatch()

    # ------------------------------------------------------------------ setup
    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        _, params = self.setup_exchange(trainer)
        self.local = LocalSGD(params, self.sync_every, self.delay, self.outer_optimizer, self.outer_lr,
                              self.outer_momentum, self.fragments, self.wire_dtype, group=self.exchange_group)
        if self._restored is not None:
            self.local.load_state_dict(self._restored["local"])
        self.attach_sync_points(trainer)

    def on_sync_start(self, trainer: pl.Trainer) -> None:
        steps = trainer.num_training_batches / max(trainer.accumulate_grad_batches, 1)
        if self.sync_every > steps:
            rank_zero_warn(f"LocalSGDStrategy(sync_every={self.sync_every}) is longer than an epoch ({steps:g} optimizer "
                           "steps): every round ends early at the epoch's sync point")

    # ------------------------------------------------------------------ the step
    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        result = super().optimizer_step(optimizer, closure, model, **kwargs)
        if self.local is not None:
            sent, waited = self.local.bytes_sent, self.local.wait_s
            self.local.after_inner_step()
            module = self.lightning_module
            module.log("local_sgd/bytes_sent", float(self.local.bytes_sent - sent), on_step=True, on_epoch=False)
            module.log("local_sgd/wait_s", self.local.wait_s - waited, on_step=True, on_epoch=False)
        return result

    def sync_point(self) -> None:
        """End every round early, apply every pending average: every rank holds the shared weights."""
        if self.local is not None:
            self.local.sync()

    def on_sync_end(self) -> None:
        self.sync_point()

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """Every rank calls this: each rank's own weights and inner optimizer state are gathered to rank 0's file."""
        if self.local is not None:
            own = ({k: v.detach().cpu() for k, v in self.lightning_module.state_dict().items()},
                   self.optimizers[0].state_dict())
            checkpoint = {**checkpoint, STATE_KEY: {"local": self.local.state_dict(), "ranks": all_gather_object(own)}}
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        saved = checkpoint.pop(STATE_KEY, None)
        self._restored = None
        if saved is not None:
            if len(saved["ranks"]) != self.world_size:
                raise ValueError(f"the checkpoint was written by {len(saved['ranks'])} ranks; this run has {self.world_size}:"
                                 " LocalSGDStrategy resumes only with as many (each takes its own weights and optimizer)")
            weights, inner = saved["ranks"][self.global_rank]
            self._restored = {"local": saved["local"], "weights": weights, "inner": inner}
        return checkpoint

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        if self._restored is not None:
            checkpoint = {**checkpoint, "state_dict": self._restored["weights"]}
        super().load_model_state_dict(checkpoint, strict=strict)

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        if self._restored is not None:
            checkpoint = {**checkpoint, "optimizer_states": [self._restored["inner"]]}
        super().load_optimizer_state_dict(checkpoint)

    def teardown(self) -> None:
        self.local = None
        self._restored = None
        super().teardown()
