"""The part every in-memory classification datamodule shares: three tensor datasets and their loaders."""

from __future__ import annotations

import pytorch_lightning as pl
from torch.utils.data import DataLoader, Dataset


class InMemoryDataModule(pl.LightningDataModule):
    """A datamodule whose :meth:`build` returns the train, validation and test datasets once.

    Subclasses call ``save_hyperparameters()`` with at least ``batch_size`` and ``num_workers`` and
    implement :meth:`build`; the sets are built on the first :meth:`setup` and reused afterwards.
    The test set also serves ``predict``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None

    def build(self) -> tuple[Dataset, Dataset, Dataset]:
        raise NotImplementedError(f"{type(self).__name__} must implement build()")

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self.train_set, self.val_set, self.test_set = self.build()

    def _loader(self, dataset: Dataset | None, shuffle: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() must run before its dataloaders are requested")
        workers = self.hparams.num_workers
        return DataLoader(
            dataset,
            batch_size=self.hparams.batch_size,
            shuffle=shuffle,
            num_workers=workers,
            persistent_workers=workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False)
