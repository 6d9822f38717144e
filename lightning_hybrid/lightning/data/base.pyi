# Generated from lightning_hybrid/data/base.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sized
import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

class EpochSeededRandomSampler(RandomSampler):

    def __init__(self, data_source: Sized, seed: int=0) -> None:
        ...

    def set_epoch(self, epoch: int) -> None:
        ...

    def __iter__(self) -> Iterator[int]:
        ...

class InMemoryDataModule(pl.LightningDataModule, ABC):

    def __init__(self) -> None:
        ...

    @abstractmethod
    def build(self) -> tuple[Dataset, Dataset, Dataset]:
        ...

    def setup(self, stage: str | None=None) -> None:
        ...
    drop_last_train = ...
    monitor = ...

    @property
    def loader_workers(self) -> int:
        ...

    def _loader(self, dataset: Dataset | None, shuffle: bool) -> DataLoader:
        ...

    def train_dataloader(self) -> DataLoader:
        ...

    def val_dataloader(self) -> DataLoader:
        ...

    def test_dataloader(self) -> DataLoader:
        ...

    def predict_dataloader(self) -> DataLoader:
        ...
