# Generated from lightning_hybrid/strategies/rank_exit_watch.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""``lightning_hybrid.strategies.rank_exit_watch`` under ``lightning``: the same objects (it imports no Lightning)."""

from lightning_hybrid.strategies.rank_exit_watch import *  # noqa: F403
from lightning_hybrid.strategies import rank_exit_watch as _same


def __getattr__(name: str) -> object:  # its other names: private ones, names outside its __all__
    return getattr(_same, name)
