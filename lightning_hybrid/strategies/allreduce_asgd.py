"""Deprecated: renamed :mod:`~lightning_hybrid.strategies.delayed_averaging_strategy`, with its class
(``DelayedAveragingStrategy``) and aliases (``delayed_averaging``, ``delayed_averaging_dc``): the default method is
delayed gradient averaging, not asynchronous SGD. Its names still import from here for a release, with a warning
naming the new place."""

from lightning_hybrid.deprecation import renamed

#: Each old name and where it is now (read by :mod:`lightning_hybrid.namespace` as a lazy table: the names are
#: Lightning glue, so the ``lightning`` flavour's module gives that flavour's).
LAZY = {
    "AllReduceASGDStrategy": "lightning_hybrid.strategies.delayed_averaging_strategy:DelayedAveragingStrategy",
    "PENDING_KEY": "lightning_hybrid.strategies.delayed_averaging_strategy",
    "METHODS": "lightning_hybrid.strategies.delayed_averaging_strategy",
    "check_settings": "lightning_hybrid.strategies.delayed_averaging_strategy",
}

__getattr__ = renamed(globals(), LAZY)
