"""Run by the HybridParallelStrategy tests: a user's script training LeNet-5 with `Trainer(strategy=HybridParallelStrategy(...))`.

    python hybrid_script.py OUT_DIR --stages 2 --dp 2 [--placement gabra|uniform|3,4] ...

The data is a fixed random tensor set (seed 0). Each rank writes the loss and its gradients of the
first optimizer step (``step0_rank{r}.pt``, taken just before the optimizer steps, after data-parallel
averaging); rank 0 writes the predictions of ``trainer.predict`` on the data, the validation
metrics and the last checkpoint's path to ``result.pt``.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.loggers import TensorBoardLogger
from torch.utils.data import DataLoader, TensorDataset

from threads import threads_per_process
from lightning_hybrid import ClassifierModule, HybridParallelStrategy
from lightning_hybrid.models import LeNet5, ResAttNet3D
from lightning_hybrid.callbacks import HeterogeneitySimulator


def make_data(samples: int, model: str = "lenet5") -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    shape, classes = ((1, 28, 28), 10) if model == "lenet5" else ((1, 16, 16, 16), 2)
    return TensorDataset(torch.randn(samples, *shape, generator=g), torch.randint(0, classes, (samples,), generator=g))


def make_module(lr: float, momentum: float, model: str = "lenet5") -> ClassifierModule:
    torch.manual_seed(1)
    net = LeNet5() if model == "lenet5" else ResAttNet3D(depth=18, base_channels=4, dropout=0.0)
    return ClassifierModule(net, optimizer=partial(torch.optim.SGD, lr=lr, momentum=momentum))


class PlainClassifier(pl.LightningModule):
    """A LightningModule without the pipeline protocol: its model is one nn.Sequential, its loss an attribute."""

    def __init__(self, net: torch.nn.Sequential, lr: float, momentum: float) -> None:
        super().__init__()
        self.model, self.loss_fn, self.lr, self.momentum = net, torch.nn.CrossEntropyLoss(), lr, momentum

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        return self.loss_fn(self(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.loss_fn(self(batch[0]), batch[1]))

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(batch[0]).argmax(dim=1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)


class RecordFirstStep(pl.Callback):
    def __init__(self, out: Path) -> None:
        self.out, self.done = out, False

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self.done:
            return
        self.done = True
        grads = {n: p.grad.detach().clone() for n, p in pl_module.named_parameters() if p.grad is not None}
        loss = trainer.callback_metrics.get("train/loss_step")
        torch.save({"grads": grads, "loss": None if loss is None else float(loss)},
                   self.out / f"step0_rank{trainer.global_rank}.pt")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--placement", default="gabra")
    parser.add_argument("--speeds", default="1,2", help="relative device speeds, or 'probe'")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--micro", default="4", help="micro-batches a batch, or 'auto'")
    parser.add_argument("--schedule", default="1F1B")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--clip", type=float, default=None)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--sync", default="sync")
    parser.add_argument("--slowdown", default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--model", default="lenet5", help="lenet5 | resattnet (3D-ResAttNet-18, base 4, 16^3 input)")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--processes-per-device", type=int, default=1)
    parser.add_argument("--plain", action="store_true", help="a plain LightningModule (PlainClassifier)")
    parser.add_argument("--fork-ranks", action="store_true", help="fork_ranks=True")
    parser.add_argument("--every-n-steps", type=int, default=0, help="also checkpoint every N steps into OUT/steps")
    parser.add_argument("--no-sanity-check", action="store_true", help="num_sanity_val_steps=0: training's first step plans")
    parser.add_argument("--tensorboard", action="store_true", help="a TensorBoardLogger writing into OUT/tb/version_0")
    args = parser.parse_args()
    torch.set_num_threads(threads_per_process(args.stages * args.dp))
    args.out.mkdir(parents=True, exist_ok=True)
    placement = args.placement if not args.placement[0].isdigit() else [int(s) for s in args.placement.split(",")]
    strategy = HybridParallelStrategy(
        pipeline_stages=args.stages, data_parallel=args.dp, placement=placement, schedule=args.schedule,
        micro_batches=args.micro if args.micro == "auto" else int(args.micro),
        devices=None if args.speeds == "probe" else [float(s) for s in args.speeds.split(",")],
        gradient_sync=args.sync, placement_options={"t_max": 300}, processes_per_device=args.processes_per_device, fork_ranks=args.fork_ranks,
    )
    callbacks = [RecordFirstStep(args.out), pl.callbacks.ModelCheckpoint(dirpath=args.out / "ckpt", save_last=True)]
    if args.every_n_steps:
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=args.out / "steps", every_n_train_steps=args.every_n_steps,
                                                      save_top_k=-1, filename="{step}"))
    if args.slowdown:
        callbacks.append(HeterogeneitySimulator(slowdown=[float(s) for s in args.slowdown.split(",")]))
    trainer = pl.Trainer(
        accelerator=args.accelerator, devices=args.stages * args.dp // args.processes_per_device, strategy=strategy, max_epochs=args.epochs,
        logger=TensorBoardLogger(args.out, name="tb", version=0) if args.tensorboard else False, enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
        gradient_clip_val=args.clip, accumulate_grad_batches=args.accumulate, deterministic=True,
        precision=args.precision, **({"num_sanity_val_steps": 0} if args.no_sanity_check else {}),
    )
    module = make_module(args.lr, args.momentum, args.model)
    if args.plain:
        module = PlainClassifier(module.net, args.lr, args.momentum)
    data = make_data(args.samples, args.model)
    train = DataLoader(data, batch_size=args.batch, shuffle=True)
    val = DataLoader(data, batch_size=args.batch)
    trainer.fit(module, train, val, ckpt_path=args.resume)
    val_metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    predictions = trainer.predict(module, DataLoader(data, batch_size=8))
    state = strategy.full_state_dict()  # every rank takes part; rank 0 gets the whole model
    if trainer.is_global_zero:
        torch.save(
            {"predictions": torch.cat(predictions), "metrics": val_metrics,
             "last": str(args.out / "ckpt" / "last.ckpt"), "placement": strategy.placement.to_dict(),
             "micro_batches": strategy.micro_batches, "notes": dict(strategy.placement.notes),
             "state": state},
            args.out / "result.pt",
        )
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
