# Generated from lightning_hybrid/data/synthetic.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import logging
import torch
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.data import TensorDataset
from lightning_hybrid.lightning.data.base import InMemoryDataModule
log = ...

def synthetic_classification(num_samples: int, shape: tuple[int, ...], num_classes: int, seed: int, noise: float=1.0, prototype_seed: int=0) -> tuple[torch.Tensor, torch.Tensor]:
    ...

class SyntheticMNISTDataModule(InMemoryDataModule):
    num_classes = ...
    input_shape = ...

    def __init__(self, num_train: int=4096, num_val: int=512, num_test: int=512, batch_size: int=64, noise: float=1.0, seed: int=0, num_workers: int=0) -> None:
        ...

    def build(self) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
        ...
