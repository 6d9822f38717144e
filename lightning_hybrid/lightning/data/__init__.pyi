# Generated from lightning_hybrid/data/__init__.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from typing import TYPE_CHECKING
from lightning_hybrid.lazy_exports import lazy_exports
from lightning_hybrid.lightning.data.adni import ADNIDataModule, BadItemError, SyntheticADNIDataModule
from lightning_hybrid.data.idx import DataFileError, read_idx, write_idx
from lightning_hybrid.lightning.data.mnist import MNIST_FILES, MNISTDataModule, MNISTNotFoundError
from lightning_hybrid.lightning.data.shard_datamodule import ShardDataModule
from lightning_hybrid.data.shards import ShardError, ShardStore, pack
from lightning_hybrid.lightning.data.synthetic import SyntheticMNISTDataModule
LAZY = ...
__all__ = sorted(LAZY)
