"""Run by tests/parameter_server/test_step_settings.py: a user's script whose schedule moves more than the learning rate
(OneCycleLR cycles SGD's momentum, or AdamW's beta1, at every step) and whose Trainer clips gradients
(``gradient_clip_val``), under DDP or a parameter-server strategy. Writes each rank's final weights
(rank{r}.pt) and rank 0's optimizer param groups at the end (groups.pt).

    python schedule_clip_script.py OUT_DIR --strategy ddp|ssp|cneural [--clip 0.5] [--servers 2] [--accumulate N]

The model and data are tests/support/train_script.py's (a user's classifier on synthetic data).
"""

import argparse
from functools import partial
from pathlib import Path

import pytorch_lightning as pl
import torch

from threads import threads_per_process
from train_script import IndexedData, RecordingClassifier
from lightning_hybrid import CNeuralStrategy, SSPStrategy
from lightning_hybrid.models import MLP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--clip", type=float, default=None, help="gradient_clip_val")
    parser.add_argument("--clip-algorithm", default="norm", help="gradient_clip_algorithm")
    parser.add_argument("--servers", type=int, default=1, help="parameter-server strategies: server shards")
    parser.add_argument("--accumulate", type=int, default=1, help="accumulate_grad_batches")
    parser.add_argument("--adamw", action="store_true", help="AdamW (OneCycleLR cycles beta1) instead of SGD")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--fork-ranks", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(threads_per_process(2))

    pl.seed_everything(0)
    strategy = args.strategy
    if strategy == "ssp":
        strategy = SSPStrategy(staleness=0, servers=args.servers, timeout=60, fork_ranks=args.fork_ranks)
    elif strategy == "cneural":
        strategy = CNeuralStrategy(servers=args.servers, timeout=60, fork_ranks=args.fork_ranks)
    steps = args.epochs * max(1, args.samples // (2 * args.batch_size) // args.accumulate)
    if args.adamw:
        optimizer = partial(torch.optim.AdamW, lr=0.01, weight_decay=0.1)
    else:
        optimizer = partial(torch.optim.SGD, lr=0.05, momentum=0.9, weight_decay=0.1)
    scheduler = {"scheduler": partial(torch.optim.lr_scheduler.OneCycleLR, max_lr=0.1 if not args.adamw else 0.01,
                                      total_steps=steps, base_momentum=0.8, max_momentum=0.95), "interval": "step"}
    module = RecordingClassifier(MLP(activation="relu"), optimizer=optimizer, scheduler=scheduler)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=strategy, max_epochs=args.epochs, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=1,
        gradient_clip_val=args.clip, gradient_clip_algorithm=args.clip_algorithm, accumulate_grad_batches=args.accumulate,
    )
    trainer.fit(module, datamodule=IndexedData(args.batch_size, args.samples))
    torch.save({k: v.detach().clone() for k, v in module.state_dict().items()}, args.out / f"rank{trainer.global_rank}.pt")
    if trainer.is_global_zero:
        groups = [{k: v for k, v in group.items() if k != "params"} for group in trainer.optimizers[0].param_groups]
        torch.save(groups, args.out / "groups.pt")


if __name__ == "__main__":
    main()
