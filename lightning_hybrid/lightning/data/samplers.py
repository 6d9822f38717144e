# Generated from lightning_hybrid/data/samplers.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""``lightning_hybrid.data.samplers`` under ``lightning``: the same objects (it imports no Lightning)."""

from lightning_hybrid.data.samplers import *  # noqa: F403
from lightning_hybrid.data import samplers as _same


def __getattr__(name: str) -> object:  # its other names: private ones, names outside its __all__
    return getattr(_same, name)
