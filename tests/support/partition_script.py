"""Run by the multi-process tests: partitioned inference with `Trainer(strategy=PartitionedInferenceStrategy(...))`.

    python partition_script.py OUT_DIR --models lenet vgg resattnet --abilities 1,2,3 --conv bodp --fc mscc_fgcp

For each model: the logits `trainer.predict` returns on this rank, the single-device logits of the
same module, and the strategy's per-layer traffic, written to OUT_DIR/<model>_rank<r>.pt. Lightning's
launcher reruns this script for the other ranks, as it would a user's.
"""

import argparse
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from threads import threads_per_process
from lightning_hybrid import ClassifierModule, PartitionedInferenceStrategy
from lightning_hybrid.models import VGG16, LeNet5, ResAttNet3D


class LogitsClassifier(ClassifierModule):
    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(batch[0])


class PlainModule(pl.LightningModule):
    """A LightningModule without the pipeline protocol or a loss: its model is one nn.Sequential."""

    def __init__(self, net: torch.nn.Sequential) -> None:
        super().__init__()
        self.model = net

    def forward(self, x):
        return self.model(x)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(batch[0])


def build(name: str) -> tuple[torch.nn.Module, tuple[int, ...]]:
    torch.manual_seed(0)
    if name == "lenet":
        return LeNet5(), (1, 28, 28)
    if name == "vgg":
        net = VGG16(num_classes=10, input_size=32, width=1 / 16, fc_width=32, batch_norm=True)
        with torch.no_grad():  # a pruned fc6, so that MSCC+FGCP has a sparse pattern to cluster
            weight = net.fc6[0].weight
            weight.mul_((torch.rand_like(weight) < 0.2).float())
        return net, (3, 32, 32)
    net = ResAttNet3D(depth=18, base_channels=4, num_classes=2)
    with torch.no_grad():
        for module in net.modules():
            if hasattr(module, "gamma"):
                module.gamma.fill_(0.5)  # a trained-like attention: not spatially local
    return net, (1, 32, 32, 24)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--models", nargs="+", default=["lenet"])
    parser.add_argument("--abilities", default="1,2")
    parser.add_argument("--conv", default="bodp")
    parser.add_argument("--fc", default="mscc_fgcp")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--processes-per-device", type=int, default=1)
    parser.add_argument("--plain", action="store_true", help="a plain LightningModule (PlainModule) instead")
    parser.add_argument("--fork-ranks", action="store_true", help="fork_ranks=True")
    args = parser.parse_args()
    abilities = [float(a) for a in args.abilities.split(",")]
    torch.set_num_threads(threads_per_process(len(abilities)))
    strategy = PartitionedInferenceStrategy(abilities=abilities, conv_partition=args.conv, fc_partition=args.fc,
                                            processes_per_device=args.processes_per_device, fork_ranks=args.fork_ranks)
    devices = len(abilities) // args.processes_per_device
    trainer = pl.Trainer(accelerator=args.accelerator, devices=devices, strategy=strategy, logger=False,
                         enable_progress_bar=False, enable_model_summary=False)
    for name in args.models:
        net, shape = build(name)
        module = PlainModule(net) if args.plain else LogitsClassifier(net, optimizer=torch.optim.SGD)
        inputs = torch.randn(5, *shape, generator=torch.Generator().manual_seed(1))
        net.eval()
        with torch.no_grad():  # the plain model's logits, on the device the strategy runs on
            reference = net.to(strategy.root_device)(inputs.to(strategy.root_device)).cpu()
        loader = DataLoader(TensorDataset(inputs, torch.zeros(5, dtype=torch.long)), batch_size=2)
        logits = torch.cat(trainer.predict(module, dataloaders=loader)).cpu()
        torch.save({"logits": logits, "reference": reference, "traffic": strategy.traffic,
                    "notes": {s.name: s.note for s in strategy.plan.steps if s.note}},
                   args.out / f"{name}_rank{trainer.global_rank}.pt")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
