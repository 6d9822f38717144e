# Generated from lightning_hybrid/data/volume_datasets.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""Preprocessed ADNI volumes as datasets: items of a split in host memory (optionally augmented in the
loader's workers), or the whole split stacked once on the training device."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch.utils.data import Dataset

log = logging.getLogger(__name__)


class Volumes(Dataset):
    """Preprocessed volumes as ``(image, label)`` pairs of plain tensors, optionally through a random
    augmentation (run in the DataLoader's workers). With ``keys`` (evaluation), ``(image, label, key)``:
    ``key`` is ``[index in this split, subject code]``, so that metrics count each scan once under a
    distributed sampler's padding and can average a subject's scans."""

    def __init__(self, preprocessed: Sequence[Any] | Dataset, augmentation: Any = None,
                 keys: Sequence[tuple[int, int]] | None = None) -> None:
        self.preprocessed, self.augmentation, self.keys = preprocessed, augmentation, keys

    def __len__(self) -> int:
        return len(self.preprocessed)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        item = self.preprocessed[index]
        if self.augmentation is not None:
            item = self.augmentation(dict(item))
        image, label = torch.as_tensor(item["image"]).float(), torch.tensor(item["label"], dtype=torch.long)
        if self.keys is None:
            return image, label
        return image, label, torch.tensor(self.keys[index], dtype=torch.long)


class VolumesOn(Dataset):
    """A split's :class:`Volumes` stacked once into tensors on ``device``: items are views of them (the
    default collate stacks a batch there, no loader workers, no host copies)."""

    def __init__(self, volumes: Dataset, device: torch.device) -> None:
        items = [volumes[index] for index in range(len(volumes))]
        self.columns = [torch.stack(column).to(device) for column in zip(*items)]
        log.info("ADNI: %d volumes (%.0f MB) held on %s", len(items), self.columns[0].nbytes / 1e6, device)

    def __len__(self) -> int:
        return len(self.columns[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        return tuple(column[index] for column in self.columns)


def in_threads(function: Any, items: Sequence[Any], threads: int, what: str) -> list[Any]:
    """``function`` of every item, ``threads`` at a time, in order, logging progress."""
    total, results = len(items), [None] * len(items)
    start = time.perf_counter()
    every = max(1, total // 10)
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for index, result in enumerate(pool.map(function, items)):
            results[index] = result
            if (index + 1) % every == 0 or index + 1 == total:
                elapsed = time.perf_counter() - start
                log.info("%s: %d/%d (%.1f/s)", what, index + 1, total, (index + 1) / max(elapsed, 1e-9))
    return results
