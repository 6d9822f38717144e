# Generated from lightning_hybrid/strategies/clip_record.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""``lightning_hybrid.strategies.clip_record`` under ``lightning``: the same objects (it imports no Lightning)."""

from lightning_hybrid.strategies.clip_record import *  # noqa: F403
from lightning_hybrid.strategies import clip_record as _same


def __getattr__(name: str) -> object:  # its other names: private ones, names outside its __all__
    return getattr(_same, name)
