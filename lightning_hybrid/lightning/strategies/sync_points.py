# Generated from lightning_hybrid/strategies/sync_points.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""The points of a fit where Lightning reads, saves or reduces the model, as one callback that calls the
strategy there: where strategies whose ranks drift apart, or hold pending work, settle it."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback


class SyncPoints(Callback):
    """Calls a strategy at the points where Lightning reads, saves or reduces the model:
    ``strategy.on_sync_start(trainer)`` when training starts, ``strategy.sync_before_validation()``
    (by default ``sync_point()``) before validation during fitting, ``strategy.on_epoch_start(trainer)``
    when each training epoch starts, ``strategy.sync_point()`` at the end of each training epoch (before
    checkpoints are written), then ``strategy.after_epoch_sync(pl_module)``, and ``strategy.on_sync_end()``
    when fitting ends. Strategies whose ranks drift apart or hold pending work settle it in ``sync_point``."""

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.strategy.on_sync_start(trainer)
        self._sync_before_validation(trainer)

    def _sync_before_validation(self, trainer: pl.Trainer) -> None:
        """Make the fit's validation loop call ``sync_point()`` before it prepares its data: that
        preparation reduces across ranks (are the loaders' lengths known everywhere?) before any
        validation hook runs, and the ranks must meet there already (an epoch's first validation
        with ``check_val_every_n_epoch > 1``, or reloaded loaders). The sanity check is left out."""
        val_loop = trainer.fit_loop.epoch_loop.val_loop
        if getattr(val_loop.setup_data, "after_sync_point", False):
            return
        setup_data = val_loop.setup_data

        def setup_data_after_sync_point() -> None:
            if not trainer.sanity_checking:
                self.strategy.sync_before_validation()
            setup_data()

        setup_data_after_sync_point.after_sync_point = True
        val_loop.setup_data = setup_data_after_sync_point

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.strategy.on_epoch_start(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.strategy.sync_point()
        self.strategy.after_epoch_sync(pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.strategy.on_sync_end()
