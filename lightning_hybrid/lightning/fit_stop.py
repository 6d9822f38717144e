# Generated from lightning_hybrid/fit_stop.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""``lightning_hybrid.fit_stop`` under ``lightning``: the same objects (it imports no Lightning)."""

from lightning_hybrid.fit_stop import *  # noqa: F403
from lightning_hybrid import fit_stop as _same


def __getattr__(name: str) -> object:  # its other names: private ones, names outside its __all__
    return getattr(_same, name)
