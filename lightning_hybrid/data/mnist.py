"""MNIST from the four standard IDX gzip files, parsed with numpy (no torchvision needed)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from lightning_hybrid.data.base import InMemoryDataModule
from lightning_hybrid.data.download import DownloadError, download
from lightning_hybrid.data.idx import read_idx
from lightning_hybrid.data.mnist_files import (  # noqa: F401  (plain: one object under both namespaces)
    MNIST_FILES, MNIST_MEAN, MNIST_MIRRORS, MNIST_STD, MNISTNotFoundError, find_mnist_folder, normalize_images)
from lightning_hybrid.data.split import seeded_split

log = logging.getLogger(__name__)

class MNISTDataModule(InMemoryDataModule):
    """MNIST digits, 60,000 training and 10,000 test images, from the four IDX gzip files.

    The files are looked up in ``root`` (flat) or in torchvision's layout ``root/MNIST/raw/``,
    their md5 digests checked, and parsed with numpy. When they are absent and ``download`` is
    true they are downloaded into ``root`` (with a progress bar); offline this fails with an error
    that names the folder, the files and the synthetic alternative.

    Args:
        root: folder holding (or to receive) the files.
        batch_size: samples per batch, per process.
        val_fraction: share of the 60,000 training images held out for validation.
        subset: if set, use only this many training images (a seeded random choice, before the
            validation split) and at most this many test images. For quick runs.
        seed: seed of the subset choice and of the train/validation split; the same seed gives the
            same split on every machine and every process.
        num_workers: DataLoader worker processes.
        download: fetch missing files from ``mirrors``.
        verify_md5: check each file against :data:`MNIST_FILES` before parsing.
        mirrors: base URLs to download from, tried in order.
        val_set: ``"holdout"`` validates on the held-out ``val_fraction`` of the training images;
            ``"test"`` validates on the test set (for time-to-test-accuracy benchmarks; never for
            choosing hyperparameters).

    Example::

        >>>         >>> from lightning_hybrid import ClassifierModule
        >>> from lightning_hybrid.data import MNISTDataModule
        >>> from lightning_hybrid.models import LeNet5
        >>> dm = MNISTDataModule("data/mnist", batch_size=64, subset=5000)
        >>> # pl.Trainer(max_epochs=1).fit(ClassifierModule(LeNet5()), datamodule=dm)
    """

    num_classes = 10
    input_shape = (1, 28, 28)

    def __init__(
        self,
        root: str | Path = "data/mnist",
        batch_size: int = 64,
        val_fraction: float = 1 / 12,
        subset: int | None = None,
        seed: int = 0,
        num_workers: int = 0,
        download: bool = True,
        verify_md5: bool = True,
        mirrors: Sequence[str] = MNIST_MIRRORS,
        val_set: str = "holdout",
    ) -> None:
        super().__init__()
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
        if subset is not None and subset < 1:
            raise ValueError(f"subset must be a positive number of images or None, got {subset}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if val_set not in ("holdout", "test"):
            raise ValueError(f"val_set must be 'holdout' or 'test', got {val_set!r}")
        mirrors = [str(m) for m in mirrors]  # plain strings in the checkpoint's hyperparameters
        self.save_hyperparameters(logger=False)
        self.root = Path(root).expanduser()

    def _not_found(self, reason: str) -> MNISTNotFoundError:
        names = "\n  ".join(MNIST_FILES)
        return MNISTNotFoundError(
            f"MNIST is not in {self.root.resolve()} ({reason}). Put these four files there (or in "
            f"{self.root / 'MNIST' / 'raw'}):\n  {names}\n"
            "or, for a run without the real data, use the synthetic stand-in: the override `data=synthetic` "
            "(lightning_hybrid.data.SyntheticMNISTDataModule)."
        )

    def prepare_data(self) -> None:
        """Download the files that are missing (called on one process per node)."""
        if find_mnist_folder(self.root) is not None:
            return
        if not self.hparams.download:
            raise self._not_found("download=False")
        existing = self.root / "MNIST" / "raw" if (self.root / "MNIST" / "raw").is_dir() else self.root
        for name in MNIST_FILES:
            if (existing / name).is_file():
                continue
            try:
                download(name, self.hparams.mirrors, existing)
            except DownloadError as err:
                raise self._not_found(f"download failed: {err}") from err

    def _load(self, folder: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
        prefix = "train" if split == "train" else "t10k"
        names = (f"{prefix}-images-idx3-ubyte.gz", f"{prefix}-labels-idx1-ubyte.gz")
        md5 = MNIST_FILES if self.hparams.verify_md5 else {}
        images, labels = (read_idx(folder / n, md5.get(n)) for n in names)
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise ValueError(
                f"{folder}: {names[0]} holds shape {images.shape} and {names[1]} shape {labels.shape}; "
                "expected (N, H, W) images with N labels"
            )
        return images, labels

    def build(self) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
        folder = find_mnist_folder(self.root)
        if folder is None:
            raise self._not_found("files missing; prepare_data() downloads them when download=True")
        hp = self.hparams
        images, labels = self._load(folder, "train")
        if hp.subset is not None and hp.subset < len(images):
            keep = np.sort(np.random.default_rng(hp.seed).permutation(len(images))[: hp.subset])
            images, labels = images[keep], labels[keep]
        train_idx, val_idx = seeded_split(len(images), hp.val_fraction, hp.seed)
        x, y = normalize_images(images), torch.from_numpy(labels.astype(np.int64))
        train_set, val_set = TensorDataset(x[train_idx], y[train_idx]), TensorDataset(x[val_idx], y[val_idx])
        test_images, test_labels = self._load(folder, "test")
        if hp.subset is not None:
            test_images, test_labels = test_images[: hp.subset], test_labels[: hp.subset]
        test_set = TensorDataset(normalize_images(test_images), torch.from_numpy(test_labels.astype(np.int64)))
        if hp.val_set == "test":
            val_set = test_set
        log.info("MNIST from %s: %d train, %d val, %d test images", folder, len(train_set), len(val_set), len(test_set))
        return train_set, val_set, test_set
