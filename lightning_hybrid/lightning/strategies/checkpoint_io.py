# Generated from lightning_hybrid/strategies/checkpoint_io.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""Checkpoints written atomically: a failed save never leaves a file named like a good checkpoint.

:class:`AtomicCheckpointIO` is Lightning's ``TorchCheckpointIO`` whose local saves go to a temporary
file in the checkpoint's folder, are flushed to disk, and are renamed into place only once complete
(``os.replace`` is atomic on POSIX and Windows). A full disk, a quota or a process killed in the
middle of a save leaves the previous checkpoint of that name (if any) untouched and no partial file
(the temporary one is removed when the save fails; a killed process leaves a ``.tmp`` file, never
a ``.ckpt``). Remote paths (``s3://`` ...) keep Lightning's own handling. Every strategy of the
suite uses it unless given another ``checkpoint_io``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` with local saves written to a temporary file and renamed into place."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options=storage_options)
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options for local paths, got {storage_options!r}")
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
