"""Samples held in memory in their stored dtype (cNeural's resident shards), converted a batch at a time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset


class ResidentShards(Dataset):
    """Samples held in memory in their stored dtype; ``__getitems__`` converts a whole batch at once.

    Integer images are scaled to [0, 1], then ``(x - mean) / std`` when those are given.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, mean: float | None = None, std: float | None = None) -> None:
        self.x = torch.from_numpy(np.ascontiguousarray(x))
        self.y = torch.from_numpy(np.ascontiguousarray(y)).long()
        self.mean, self.std = mean, std

    def __len__(self) -> int:
        return len(self.y)

    @property
    def nbytes(self) -> int:
        return self.x.numel() * self.x.element_size() + self.y.numel() * self.y.element_size()

    def _convert(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_floating_point(x):
            x = x.float().div_(float(torch.iinfo(self.x.dtype).max))
        elif x.dtype != torch.float32:
            x = x.float()
        if self.mean is not None:
            x = (x - self.mean) / (self.std if self.std else 1.0)
        return x

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._convert(self.x[index]), self.y[index]

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        return self._convert(self.x[index]), self.y[index]



def batch_as_is(batch: Any) -> Any:
    """Collate function for :class:`ResidentShards`: its ``__getitems__`` already returns a batch."""
    return batch
