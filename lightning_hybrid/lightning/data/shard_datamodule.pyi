# Generated from lightning_hybrid/data/shard_datamodule.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import logging
import os
import time
from collections.abc import Sequence
from typing import Any
import numpy as np
import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from lightning_hybrid.data.shards import ShardError, ShardStore, assign_shards, logical_workers
from lightning_hybrid.devices import parse_size
log = ...

class ResidentShards(Dataset):

    def __init__(self, x: np.ndarray, y: np.ndarray, mean: float | None=None, std: float | None=None) -> None:
        ...

    def __len__(self) -> int:
        ...

    @property
    def nbytes(self) -> int:
        ...

    def _convert(self, x: torch.Tensor) -> torch.Tensor:
        ...

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        ...

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        ...

def batch_as_is(batch: Any) -> Any:
    ...

class LocalShuffleSampler(DistributedSampler):

    def __init__(self, dataset: Dataset, seed: int=0, rank: int=0) -> None:
        ...

class ShardDataModule(pl.LightningDataModule):

    def __init__(self, train_store: str, val_store: str | None=None, test_store: str | None=None, batch_size: int=1000, quota: str | int | float='2GiB', mean: float | None=None, std: float | None=None, resident: bool=True, load_threads: int=4, seed: int=0, num_workers: int=0) -> None:
        ...

    def _placement(self) -> tuple[int, int, int]:
        ...

    def load_share(self, rank: int, world_size: int) -> ResidentShards:
        ...

    def read_share(self, rank: int, world_size: int) -> ResidentShards:
        ...

    def _load_whole(self, root: str | None) -> ResidentShards | None:
        ...

    def _check_machine(self, local_workers: int) -> None:
        ...

    def setup(self, stage: str | None=None) -> None:
        ...

    def _loader(self, dataset: ResidentShards | None, name: str, sampler: Any=None) -> DataLoader:
        ...

    def train_dataloader(self) -> DataLoader:
        ...

    def val_dataloader(self) -> DataLoader | list:
        ...

    def test_dataloader(self) -> DataLoader:
        ...

    def predict_dataloader(self) -> DataLoader:
        ...
