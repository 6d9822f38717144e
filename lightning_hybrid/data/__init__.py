"""Datamodules and data-file utilities."""

from lightning_hybrid.data.adni import ADNIDataModule, BadItemError, SyntheticADNIDataModule
from lightning_hybrid.data.idx import DataFileError, read_idx, write_idx
from lightning_hybrid.data.mnist import MNIST_FILES, MNISTDataModule, MNISTNotFoundError
from lightning_hybrid.data.shard_datamodule import ShardDataModule
from lightning_hybrid.data.shards import ShardError, ShardStore, pack
from lightning_hybrid.data.synthetic import SyntheticMNISTDataModule

__all__ = [
    "ADNIDataModule",
    "BadItemError",
    "DataFileError",
    "MNIST_FILES",
    "MNISTDataModule",
    "MNISTNotFoundError",
    "ShardDataModule",
    "ShardError",
    "ShardStore",
    "SyntheticADNIDataModule",
    "SyntheticMNISTDataModule",
    "pack",
    "read_idx",
    "write_idx",
]
