"""Deprecated: this module was cut at its concepts. Its names still import from here for a release, with a
warning naming the new place: the strategies' base :mod:`~lightning_hybrid.strategies.checked_ddp` (which
also took ``UnwrappedDDPStrategy``'s part: ``wraps_model = False``), the launcher
:mod:`~lightning_hybrid.strategies.launcher`, :mod:`~lightning_hybrid.strategies.refusals`,
:mod:`~lightning_hybrid.strategies.replaced_step` and ``stop_if_agreed`` in
:mod:`~lightning_hybrid.strategies.meeting`."""

from lightning_hybrid.deprecation import renamed

#: Each old name and where it is now (read by :mod:`lightning_hybrid.namespace` as a lazy table: the names are
#: Lightning glue, so the ``lightning`` flavour's module gives that flavour's).
LAZY = {
    "CheckedDDPStrategy": "lightning_hybrid.strategies.checked_ddp",
    "UnwrappedDDPStrategy": "lightning_hybrid.strategies.checked_ddp:CheckedDDPStrategy",
    "CHAINED_HOOKS": "lightning_hybrid.strategies.checked_ddp",
    "one_bucket_mb": "lightning_hybrid.strategies.checked_ddp",
    "CheckingLauncher": "lightning_hybrid.strategies.launcher",
    "refuse_unindexed_training_data": "lightning_hybrid.strategies.refusals",
    "refuse_manual_optimization": "lightning_hybrid.strategies.refusals",
    "refuse_mid_epoch_checkpoints": "lightning_hybrid.strategies.refusals",
    "single_optimizer": "lightning_hybrid.strategies.refusals",
    "refuse_grad_scaler": "lightning_hybrid.strategies.refusals",
    "ReplacedStep": "lightning_hybrid.strategies.replaced_step",
    "unwrap_optimizer": "lightning_hybrid.strategies.replaced_step",
    "stop_if_agreed": "lightning_hybrid.strategies.meeting",
}

__getattr__ = renamed(globals(), LAZY)
