# Generated from lightning_hybrid/cli/data.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import logging
log = ...

def data_command(argv: list[str]) -> None:
    ...
