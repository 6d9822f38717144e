"""Datamodules and data-file utilities.

The names below are imported on first use (PEP 562): importing a plain reader of this package
(``lightning_hybrid.data.idx``, ``.clinicadl``, ``.adni_settings``, ...) imports no Lightning, so it is one
module, with one class per concept, under both Lightning namespaces (:mod:`lightning_hybrid.namespace`).
"""

from typing import TYPE_CHECKING

from lightning_hybrid.deprecation import renamed
from lightning_hybrid.lazy_exports import lazy_exports

if TYPE_CHECKING:  # the names for type checkers; at run time, __getattr__ below imports them
    from lightning_hybrid.data.adni import ADNIDataModule, BadItemError, PhantomADNIDataModule
    from lightning_hybrid.data.idx import DataFileError, read_idx, write_idx
    from lightning_hybrid.data.mnist import MNIST_FILES, MNISTDataModule, MNISTNotFoundError
    from lightning_hybrid.data.shard_datamodule import ShardDataModule
    from lightning_hybrid.data.shards import ShardError, ShardStore, pack
    from lightning_hybrid.data.synthetic_mnist import SyntheticMNISTDataModule

#: Each name this package exports, and the module that defines it.
LAZY = {
    "ADNIDataModule": "lightning_hybrid.data.adni",
    "BadItemError": "lightning_hybrid.data.adni",
    "PhantomADNIDataModule": "lightning_hybrid.data.adni",
    "DataFileError": "lightning_hybrid.data.idx",
    "read_idx": "lightning_hybrid.data.idx",
    "write_idx": "lightning_hybrid.data.idx",
    "MNIST_FILES": "lightning_hybrid.data.mnist",
    "MNISTDataModule": "lightning_hybrid.data.mnist",
    "MNISTNotFoundError": "lightning_hybrid.data.mnist",
    "ShardDataModule": "lightning_hybrid.data.shard_datamodule",
    "ShardError": "lightning_hybrid.data.shards",
    "ShardStore": "lightning_hybrid.data.shards",
    "pack": "lightning_hybrid.data.shards",
    "SyntheticMNISTDataModule": "lightning_hybrid.data.synthetic_mnist",
}

__all__ = sorted(LAZY)

#: Old names (a warning names the new one): the ellipsoid cohort was "synthetic ADNI" until 2026-11-29.
RENAMED = {"SyntheticADNIDataModule": "lightning_hybrid.data:PhantomADNIDataModule"}

_exported, __dir__ = lazy_exports(globals(), LAZY)
_renamed = renamed(globals(), RENAMED)


def __getattr__(name: str) -> object:
    return _renamed(name) if name in RENAMED else _exported(name)
