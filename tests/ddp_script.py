"""Run by tests/test_ddp_trainer.py: a user's own script training with `Trainer(strategy=...)`.

    python ddp_script.py OUT_DIR STRATEGY DEVICES BATCH_SIZE

Trains ClassifierModule(MLP) with plain SGD on a synthetic dataset for three epochs and saves each rank's final parameters to OUT_DIR/rank{r}.pt. Lightning's DDP launcher
reruns this script for rank 1, as it would a user's.
"""

import sys
from functools import partial
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_hybrid import ClassifierModule
from lightning_hybrid.data.base import EpochSeededRandomSampler
from lightning_hybrid.data.synthetic import synthetic_classification
from lightning_hybrid.models import MLP


class ShuffledData(pl.LightningDataModule):
    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.data = TensorDataset(*synthetic_classification(256, (1, 28, 28), 10, seed=1))

    def train_dataloader(self):
        # Under DDP, Lightning replaces this sampler by DistributedSampler(seed=0), whose permutation
        # EpochSeededRandomSampler(seed=0) reproduces for a single process.
        return DataLoader(self.data, batch_size=self.batch_size, sampler=EpochSeededRandomSampler(self.data, seed=0))

    def test_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)


def main() -> None:
    out, strategy, devices, batch_size = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    pl.seed_everything(0)
    module = ClassifierModule(MLP(activation="relu"), optimizer=partial(torch.optim.SGD, lr=0.1))
    trainer = pl.Trainer(
        accelerator="cpu", devices=devices, strategy=strategy, max_epochs=3, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(module, datamodule=ShuffledData(batch_size))
    torch.save({k: v.detach().clone() for k, v in module.state_dict().items()}, out / f"rank{trainer.global_rank}.pt")
    (result,) = trainer.test(module, datamodule=ShuffledData(batch_size), verbose=False)
    if trainer.is_global_zero:
        (out / "test_acc.txt").write_text(str(result["test/acc"]))
    # Without this, torch 2.13's gloo sometimes aborts a rank at interpreter exit after trainer.test
    # ("terminate called without an active exception"); the lightning-hybrid CLI does the same.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
