# Generated from lightning_hybrid/comm/outer_rounds.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""``lightning_hybrid.comm.outer_rounds`` under ``lightning``: the same objects (it imports no Lightning)."""

from lightning_hybrid.comm.outer_rounds import *  # noqa: F403
from lightning_hybrid.comm import outer_rounds as _same


def __getattr__(name: str) -> object:  # its other names: private ones, names outside its __all__
    return getattr(_same, name)
