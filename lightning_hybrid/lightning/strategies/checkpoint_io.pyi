# Generated from lightning_hybrid/strategies/checkpoint_io.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import os
import tempfile
from pathlib import Path
from typing import Any
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

class AtomicCheckpointIO(TorchCheckpointIO):

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any=None) -> None:
        ...
