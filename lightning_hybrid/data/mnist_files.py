"""MNIST's four IDX gzip files: their names and digests, where they are found and fetched from, and the
pixels' statistics (plain: the datamodule is :class:`lightning_hybrid.data.mnist.MNISTDataModule`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

#: The four standard files and their md5 digests (the same as torchvision's).
MNIST_FILES = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
#: Mean and standard deviation of the MNIST training pixels (scaled to [0, 1]).
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


class MNISTNotFoundError(FileNotFoundError):
    """The MNIST files are not in the data folder and could not be downloaded."""


def find_mnist_folder(root: str | Path) -> Path | None:
    """The folder under ``root`` that holds all four files: ``root`` itself or torchvision's ``root/MNIST/raw``."""
    root = Path(root)
    for folder in (root, root / "MNIST" / "raw"):
        if all((folder / name).is_file() for name in MNIST_FILES):
            return folder
    return None


def normalize_images(images: np.ndarray) -> torch.Tensor:
    """uint8 images (N, 28, 28) to float32 tensors (N, 1, 28, 28) standardized with MNIST's statistics."""
    x = torch.from_numpy(np.ascontiguousarray(images)).unsqueeze(1).float().div_(255.0)
    return x.sub_(MNIST_MEAN).div_(MNIST_STD)
