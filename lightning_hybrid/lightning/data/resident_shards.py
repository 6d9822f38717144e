# Generated from lightning_hybrid/data/resident_shards.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""``lightning_hybrid.data.resident_shards`` under ``lightning``: the same objects (it imports no Lightning)."""

from lightning_hybrid.data.resident_shards import *  # noqa: F403
from lightning_hybrid.data import resident_shards as _same


def __getattr__(name: str) -> object:  # its other names: private ones, names outside its __all__
    return getattr(_same, name)
