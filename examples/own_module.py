"""Your own LightningModule and data under any lightning-hybrid strategy: a complete script.

    python examples/own_module.py --strategy ssp_delay  # or balanced, delayed_averaging, cneural, hybrid, ...
    python examples/own_module.py --strategy partitioned_inference --checkpoint runs/own_module/model.ckpt

The data is yours: a folder of samples, one ``.npy`` file each, and ``labels.csv`` (written here on
first use: 16 x 16 images of a bright square in the top or the bottom half). The module is a plain
LightningModule over an ``nn.Sequential``, so every strategy takes it, the pipeline included.
Written for ``import lightning as L``; with ``pytorch_lightning`` change the two marked imports.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import lightning as L  # with pytorch_lightning: import pytorch_lightning as L
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from lightning_hybrid.lightning.straggler import StragglerReport  # with pytorch_lightning: lightning_hybrid.straggler


# ---------------------------------------------------------------------- your data: files on disk
def write_example_data(root: Path, samples: int = 512, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    with open(root / "labels.csv", "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["file", "label"])
        for i in range(samples):
            label = int(rng.integers(2))
            image = rng.normal(0.0, 0.5, size=(1, 16, 16)).astype(np.float32)
            top = int(rng.integers(0, 4)) + (0 if label == 0 else 8)
            left = int(rng.integers(0, 10))
            image[0, top:top + 4, left:left + 6] += 2.0
            np.save(root / "images" / f"{i:05d}.npy", image)
            rows.writerow([f"images/{i:05d}.npy", label])


class FolderDataset(Dataset):
    """Map-style: a length and sample ``i`` read from its file (what SSP and balanced deal by index)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        with open(root / "labels.csv", newline="") as f:
            self.rows = [(row["file"], int(row["label"])) for row in csv.DictReader(f)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        file, label = self.rows[i]
        return torch.from_numpy(np.load(self.root / file)), label


class FolderData(L.LightningDataModule):
    def __init__(self, root: Path, batch_size: int = 32) -> None:
        super().__init__()
        self.root, self.batch_size = root, batch_size

    def prepare_data(self) -> None:  # once, on rank 0 of each machine
        if not (self.root / "labels.csv").is_file():
            write_example_data(self.root)

    def setup(self, stage: str) -> None:
        dataset = FolderDataset(self.root)
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0)).tolist()
        cut = len(dataset) * 3 // 4
        self.train, self.val = Subset(dataset, order[:cut]), Subset(dataset, order[cut:])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.batch_size)

    def predict_dataloader(self) -> DataLoader:
        return self.val_dataloader()


# ---------------------------------------------------------------------- your module
class SquareNet(L.LightningModule):
    def __init__(self, lr: float = 0.05, momentum: float = 0.9) -> None:
        super().__init__()
        self.save_hyperparameters()
        # One nn.Sequential holding every parameter: the pipeline cuts it into stages, partitioned
        # inference splits its convolutions; data-parallel strategies need nothing of it.
        self.model = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(16 * 4 * 4, 2),
        )
        self.loss_fn = nn.CrossEntropyLoss()  # the pipeline finds the loss under this name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.loss_fn(self(x), y)
        self.log("train/loss", loss)
        return loss

    def on_pipeline_step(self, output, target, loss):
        """strategy="hybrid" trains through the blocks and loss_fn, not training_step: log here."""
        self.log("train/loss", loss)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/acc", (self(x).argmax(1) == y).float().mean(), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return self(batch[0]).argmax(1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=self.hparams.momentum)


# ---------------------------------------------------------------------- training or partitioned inference
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strategy", default="ssp_delay", help="any alias: ssp_delay, ssp_bounded, ssp_async, "
                        "balanced, delayed_averaging, delayed_averaging_dc, cneural, hybrid, partitioned_inference; "
                        "or ddp")
    parser.add_argument("--devices", type=int, default=2, help="processes (CPU) or GPUs")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path("data/own_module"))
    parser.add_argument("--out", type=Path, default=Path("runs/own_module"))
    parser.add_argument("--checkpoint", type=Path, help="partitioned_inference: the trained model to run")
    args = parser.parse_args()
    L.seed_everything(0)
    data = FolderData(args.data)

    if args.strategy == "partitioned_inference":  # inference only: predict with a model trained before
        model = SquareNet.load_from_checkpoint(args.checkpoint, map_location="cpu")
        trainer = L.Trainer(accelerator=args.accelerator, devices=args.devices, strategy=args.strategy, logger=False)
        predictions = torch.cat(trainer.predict(model, datamodule=data))
        if trainer.is_global_zero:
            labels = torch.tensor([label for _, label in data.val])
            result = {"strategy": type(trainer.strategy).__name__, "acc": (predictions == labels).float().mean().item()}
            (args.out / "predict.json").write_text(json.dumps(result))
            print(result)
        return

    # strategy="delayed_averaging": each rank steps with its gradient at once, corrected by the average a step late.
    model = SquareNet()
    trainer = L.Trainer(accelerator=args.accelerator, devices=args.devices, strategy=args.strategy,
                        max_epochs=args.epochs * (8 if args.strategy == "cneural" else 1),  # cNeural: one step a pass
                        default_root_dir=args.out, callbacks=[StragglerReport()], enable_checkpointing=False)
    trainer.fit(model, datamodule=data)
    trainer.save_checkpoint(args.out / "model.ckpt")  # every rank calls it (the pipeline gathers its stages)
    if trainer.is_global_zero:
        result = {"strategy": type(trainer.strategy).__name__, "acc": trainer.callback_metrics["val/acc"].item()}
        (args.out / "metrics.json").write_text(json.dumps(result))
        print(result)


if __name__ == "__main__":
    main()
