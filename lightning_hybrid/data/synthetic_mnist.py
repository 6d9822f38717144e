"""A synthetic stand-in for MNIST, for offline smoke runs: same shapes, learnable, and clearly labelled."""

from __future__ import annotations

import logging

import torch
from pytorch_lightning.utilities import rank_zero_only
from torch.utils.data import TensorDataset

from lightning_hybrid.data.base import InMemoryDataModule

log = logging.getLogger(__name__)


def synthetic_classification(
    num_samples: int,
    shape: tuple[int, ...],
    num_classes: int,
    seed: int,
    noise: float = 1.0,
    prototype_seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``num_samples`` inputs of ``shape``: a per-class random prototype plus Gaussian noise.

    The prototypes depend only on ``prototype_seed``, so train, validation and test sets built with
    different ``seed`` s share the same classes. Labels cycle through the classes (balanced) in a
    seeded random order.
    """
    protos = torch.randn((num_classes, *shape), generator=torch.Generator().manual_seed(prototype_seed))
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(num_samples) % num_classes
    labels = labels[torch.randperm(num_samples, generator=gen)]
    x = protos[labels] + noise * torch.randn((num_samples, *shape), generator=gen)
    return x, labels


class SyntheticMNISTDataModule(InMemoryDataModule):
    """Random data with MNIST's shapes (1x28x28 inputs, 10 classes) for runs without the real files.

    Each class is a fixed random prototype image plus Gaussian noise of scale ``noise``, so a
    model can learn it and accuracy means something in a smoke run, but it is not MNIST: the
    datamodule says so in a logged warning when its data are built.

    Example::

        >>> dm = SyntheticMNISTDataModule(num_train=512, num_val=64, num_test=64, batch_size=32)
        >>> dm.setup()
        >>> x, y = next(iter(dm.train_dataloader()))
        >>> tuple(x.shape), tuple(y.shape)
        ((32, 1, 28, 28), (32,))
    """

    num_classes = 10
    input_shape = (1, 28, 28)

    def __init__(
        self,
        num_train: int = 4096,
        num_val: int = 512,
        num_test: int = 512,
        batch_size: int = 64,
        noise: float = 1.0,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        for name, value in (("num_train", num_train), ("num_val", num_val), ("num_test", num_test)):
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        self.save_hyperparameters(logger=False)

    def build(self) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
        hp = self.hparams
        rank_zero_only(log.warning)(
            f"Training on SYNTHETIC data (random prototypes plus noise, {hp.num_train} train samples), "
            "not MNIST: accuracies from this run say nothing about MNIST. Use data=mnist for the real digits."
        )
        sets = []
        for offset, n in enumerate((hp.num_train, hp.num_val, hp.num_test)):
            x, y = synthetic_classification(
                n, self.input_shape, self.num_classes, seed=hp.seed * 3 + offset + 1, noise=hp.noise, prototype_seed=hp.seed
            )
            sets.append(TensorDataset(x, y))
        return sets[0], sets[1], sets[2]
