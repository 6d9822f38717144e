"""Run by the conformance tests: a user's script that trains one small classifier under any strategy, DDP's
included, with the options users combine, and writes what the tests compare with DDP's run of the same.

    python conformance_script.py OUT_DIR --strategy ddp|ssp|cneural|balanced|dga|pipe_sgd|local_sgd|hybrid|fsdp2|fsdp2_shard_grad_op [options]

Writes each rank's final weights (``rank{r}.pt``), the weights it built (``initial_rank{r}.pt``) and those it started
training from once the strategy was set up (``start_rank{r}.pt``, with its process id in ``pid_rank{r}``), and
rank 0's logged metrics at the end (``metrics.json``). ``--init per-rank`` makes each rank build its own weights (a seed
of its own, in ``setup()``, as an unseeded run would); ``same`` gives every rank rank 0's. ``--uneven 3,4`` gives
the ranks 3 and 4 training batches (their own loaders; ``--iterable``: an IterableDataset without a length).
Lightning's launcher runs this script again for the other ranks (or forks them: ``--fork-ranks``).
"""

import argparse
import json
import os
import time
from functools import partial
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, Subset, TensorDataset

from threads import threads_per_process
from lightning_hybrid import (
    DelayedAveragingStrategy, BalancedDataParallelStrategy, ClassifierModule, CNeuralStrategy, HybridParallelStrategy,
    LocalSGDStrategy, SSPStrategy,
)

SAMPLES, FEATURES, CLASSES = 256, 20, 4


def plain(state: dict) -> dict:
    """A state dict's tensors as plain tensors (a fully sharded model's gathered: every rank calls this)."""
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone() for k, v in state.items()}


class Net(nn.Sequential):
    num_classes = CLASSES

    def __init__(self) -> None:
        super().__init__(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, CLASSES))


class Module(ClassifierModule):
    """The classifier with a user's usual extras: a frozen first layer, a parameter the loss never uses,
    weights each rank builds itself."""

    def __init__(self, unused: bool, **kwargs) -> None:
        super().__init__(Net(), **kwargs)
        self.aux = nn.Parameter(torch.ones(3)) if unused else None  # an auxiliary head left out of the loss
        self.args: argparse.Namespace | None = None  # the script's settings (kept out of the hyperparameters)

    def setup(self, stage: str) -> None:
        super().setup(stage)
        rank = self.trainer.global_rank
        torch.manual_seed(1000 + (rank if self.args.init == "per-rank" else 0))  # an unseeded run's own weights
        for layer in self.net:
            if hasattr(layer, "reset_parameters"):
                layer.reset_parameters()
        if self.args.freeze:
            self.net[0].requires_grad_(False)
        torch.save({k: v.detach().clone() for k, v in self.state_dict().items()}, self.args.out / f"initial_rank{rank}.pt")

    def on_train_start(self) -> None:
        """The weights each rank starts training from, once the strategy has set up."""
        torch.save(plain(self.state_dict()), self.args.out / f"start_rank{self.trainer.global_rank}.pt")
        (self.args.out / f"pid_rank{self.trainer.global_rank}").write_text(str(os.getpid()))


class Batches(IterableDataset):
    """``count`` batches' samples of the data, without a length (a stream whose shards differ per rank)."""

    def __init__(self, data: TensorDataset, count: int) -> None:
        self.data, self.count = data, count

    def __iter__(self):
        return iter(self.data[i] for i in range(self.count))


class Data(pl.LightningDataModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        x = torch.randn(SAMPLES + 64, FEATURES, generator=g)
        y = (x @ torch.randn(FEATURES, CLASSES, generator=g)).argmax(dim=1)
        self.train, self.val = TensorDataset(x[:SAMPLES], y[:SAMPLES]), TensorDataset(x[SAMPLES:], y[SAMPLES:])
        self.args = args

    def train_dataloader(self):
        size = self.args.batch_size
        if self.args.uneven:  # this rank's own data: as many batches as --uneven gives it
            count = int(self.args.uneven.split(",")[self.trainer.global_rank]) * size
            data = Batches(self.train, count) if self.args.iterable else Subset(self.train, range(count))
            return DataLoader(data, batch_size=size)
        return DataLoader(self.train, batch_size=size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=32)


def strategy_of(args: argparse.Namespace):
    common = {"fork_ranks": args.fork_ranks}
    name = args.strategy
    if name == "ddp":
        return "ddp_find_unused_parameters_true" if args.unused else "ddp"
    if name == "ssp":
        return SSPStrategy(staleness=args.staleness, **common)
    if name == "cneural":
        return CNeuralStrategy(**common)
    if name == "balanced":
        return BalancedDataParallelStrategy(find_unused_parameters=args.unused, **common)
    if name in ("dga", "pipe_sgd"):
        return DelayedAveragingStrategy(delay=args.delay, method=name, momentum_correction=None if name == "pipe_sgd" else "auto",
                                     **common)
    if name == "local_sgd":
        return LocalSGDStrategy(sync_every=args.sync_every, delay=args.delay, **common)
    if name in ("fsdp2", "fsdp2_shard_grad_op"):
        from lightning_hybrid.strategies.fsdp2 import FullyShardedStrategy

        return FullyShardedStrategy(reshard_after_forward=name == "fsdp2", **common)
    if name == "hybrid":
        return HybridParallelStrategy(pipeline_stages=args.stages, data_parallel=2 // args.stages, micro_batches=2, **common)
    raise ValueError(f"unknown strategy {name}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--staleness", type=int, default=0)
    parser.add_argument("--delay", type=int, default=0)
    parser.add_argument("--sync-every", type=int, default=1)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--init", choices=("same", "per-rank"), default="same")
    parser.add_argument("--freeze", action="store_true")
    parser.add_argument("--unused", action="store_true")
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--clip", type=float, default=None)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--scheduler", choices=("none", "onecycle", "step"), default="none")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--uneven", default="")
    parser.add_argument("--iterable", action="store_true")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--checkpoint-dir", type=Path, default=None, help="a checkpoint at each epoch's end")
    parser.add_argument("--resume", default=None, help="the checkpoint to resume from")
    parser.add_argument("--fork-ranks", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(threads_per_process(2))

    replicas = 2 if args.strategy != "hybrid" else 2 // args.stages
    steps = (SAMPLES // (replicas * args.batch_size)) // args.accumulate
    if args.optimizer == "sgd":
        optimizer = partial(torch.optim.SGD, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    else:
        optimizer = partial(torch.optim.AdamW, lr=args.lr, weight_decay=args.weight_decay)
    scheduler = None
    if args.scheduler == "onecycle":  # the learning rate and the momentum (beta1) cycled every step
        scheduler = {"scheduler": partial(torch.optim.lr_scheduler.OneCycleLR, max_lr=args.lr, total_steps=steps * args.epochs,
                                          base_momentum=0.85, max_momentum=0.95), "interval": "step"}
    elif args.scheduler == "step":
        scheduler = partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5)
    module = Module(args.unused, optimizer=optimizer, scheduler=scheduler)
    module.args = args

    class Slow(pl.Callback):
        def on_train_batch_end(self, trainer, *_):
            time.sleep(args.step_sleep)

    callbacks = [Slow()] if args.step_sleep else []
    if args.checkpoint_dir:
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=args.checkpoint_dir, save_top_k=-1, filename="{epoch}"))
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=strategy_of(args), max_epochs=args.epochs, logger=False,
        enable_checkpointing=bool(args.checkpoint_dir), enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, gradient_clip_val=args.clip, accumulate_grad_batches=args.accumulate,
        precision=args.precision, use_distributed_sampler=not args.uneven, callbacks=callbacks,
    )
    trainer.fit(module, datamodule=Data(args), ckpt_path=args.resume)
    rank = trainer.global_rank
    torch.save(plain(module.state_dict()), args.out / f"rank{rank}.pt")
    if trainer.is_global_zero:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        (args.out / "metrics.json").write_text(json.dumps(metrics))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
