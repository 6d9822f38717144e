"""Datamodules and data-file utilities."""

from lightning_hybrid.data.adni import ADNIDataModule, BadItemError, SyntheticADNIDataModule
from lightning_hybrid.data.idx import DataFileError, read_idx, write_idx
from lightning_hybrid.data.mnist import MNIST_FILES, MNISTDataModule, MNISTNotFoundError
from lightning_hybrid.data.synthetic import SyntheticMNISTDataModule

__all__ = [
    "ADNIDataModule",
    "BadItemError",
    "DataFileError",
    "MNIST_FILES",
    "MNISTDataModule",
    "MNISTNotFoundError",
    "SyntheticADNIDataModule",
    "SyntheticMNISTDataModule",
    "read_idx",
    "write_idx",
]
