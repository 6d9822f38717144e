# Generated from lightning_hybrid/data/base.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""The part every in-memory classification datamodule shares: three tensor datasets and their loaders."""

from __future__ import annotations

from abc import ABC, abstractmethod

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_hybrid.data.samplers import EpochSeededRandomSampler


class InMemoryDataModule(pl.LightningDataModule, ABC):
    """A datamodule whose :meth:`build` returns the train, validation and test datasets once.

    Subclasses call ``save_hyperparameters()`` with at least ``batch_size`` and ``num_workers`` (and
    optionally ``pin_memory``: a bool or ``"auto"``, pinned when CUDA is present, and
    ``prefetch_factor``) and implement :meth:`build`; the sets are built on the first :meth:`setup` and reused afterwards.
    The test set also serves ``predict``. Training batches are shuffled by
    :class:`EpochSeededRandomSampler`, so a resumed run sees the batches an uninterrupted one would.
    """

    def __init__(self) -> None:
        super().__init__()
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None

    @abstractmethod
    def build(self) -> tuple[Dataset, Dataset, Dataset]:
        """The train, validation and test datasets."""

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self.train_set, self.val_set, self.test_set = self.build()

    #: Drop the last incomplete training batch (BatchNorm cannot train on a batch of one).
    drop_last_train = False
    #: The metric that picks checkpoints and stops early, and its direction (the CLI's ``monitor: auto``).
    monitor = ("val/acc", "max")

    @property
    def loader_workers(self) -> int:
        """DataLoader worker processes (``num_workers``)."""
        return int(self.hparams.num_workers)

    def _loader(self, dataset: Dataset | None, shuffle: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() must run before its dataloaders are requested")
        workers = self.loader_workers
        pin_memory = self.hparams.get("pin_memory", False)
        if pin_memory == "auto":
            pin_memory = torch.cuda.is_available()
        return DataLoader(
            dataset,
            batch_size=self.hparams.batch_size,
            sampler=EpochSeededRandomSampler(dataset, seed=self.hparams.get("seed", 0)) if shuffle else None,
            drop_last=shuffle and self.drop_last_train,
            num_workers=workers,
            persistent_workers=workers > 0,
            pin_memory=bool(pin_memory),
            prefetch_factor=self.hparams.get("prefetch_factor", 2) if workers > 0 else None,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False)
