# Generated from lightning_hybrid/strategies/gradient_sum.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any
import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.data import extract_batch_size

@contextlib.contextmanager
def logging_off(module: pl.LightningModule) -> Iterator[None]:
    ...

def gradient_sum(module: pl.LightningModule, params: Sequence[torch.Tensor], batches: Iterable[Any], to_device: Callable[[Any], Any]=lambda batch: batch, step_context: Callable[[], contextlib.AbstractContextManager]=contextlib.nullcontext) -> tuple[torch.Tensor, int, torch.Tensor]:
    ...
