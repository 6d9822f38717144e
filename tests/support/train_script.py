"""Run by the multi-process tests: a user's own script training with `Trainer(strategy=...)`.

    python train_script.py OUT_DIR [--strategy ddp|auto|ssp|cneural|asgd|balanced] [--staleness S] ...

Trains ClassifierModule(MLP) with SGD on a synthetic dataset whose batches carry their sample
indices, and writes to OUT_DIR: each rank's final parameters (rank{r}.pt), the sample indices each
rank trained on per epoch (indices_rank{r}.pt), rank 0's test accuracy (test_acc.txt), for SSP
the strategy's per-epoch statistics (ssp_history.json), and for the balanced strategy each rank's
batches per epoch (batches_rank{r}.pt) and rank 0's share changes, per-epoch history and logged
`balanced/` metrics (balanced.json). Lightning's launcher reruns this script for
the other ranks, as it would a user's.
"""

import argparse
import json
import os
import signal
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from threads import threads_per_process
from lightning_hybrid import (
    DelayedAveragingStrategy, BalancedDataParallelStrategy, ClassifierModule, CNeuralStrategy, LocalSGDStrategy, SSPStrategy,
)
from lightning_hybrid.strategies import ParameterServerStrategy
from lightning_hybrid.callbacks import EpochTimer
from lightning_hybrid.data.base import EpochSeededRandomSampler
from lightning_hybrid.data.synthetic_mnist import synthetic_classification
from lightning_hybrid.models import MLP
from lightning_hybrid.callbacks import HeterogeneitySimulator
from lightning_hybrid.straggler import StragglerReport


class SlowSamples(TensorDataset):
    """A user's dataset whose samples take ``sleep`` seconds each to read (a slow disk)."""

    def __init__(self, *tensors: torch.Tensor, sleep: float = 0.0) -> None:
        super().__init__(*tensors)
        self.sleep = sleep

    def __getitem__(self, index):
        time.sleep(self.sleep)
        return super().__getitem__(index)


class IndexedData(pl.LightningDataModule):
    def __init__(self, batch_size: int, samples: int, noise: float = 1.0, test_samples: int = 128,
                 slow_rank: int | None = None, sample_read_s: float = 0.0) -> None:
        super().__init__()
        self.batch_size = batch_size
        x, y = synthetic_classification(samples, (1, 28, 28), 10, seed=1, noise=noise)
        self.data = TensorDataset(x, y, torch.arange(samples))
        self.test = TensorDataset(*synthetic_classification(test_samples, (1, 28, 28), 10, seed=2, noise=noise))
        self.slow_rank, self.sample_read_s = slow_rank, sample_read_s

    def train_dataloader(self):
        # Under DDP, Lightning replaces this sampler by DistributedSampler(seed=0), whose permutation
        # EpochSeededRandomSampler(seed=0) reproduces for a single process.
        data = self.data
        if self.slow_rank is not None and self.trainer.global_rank == self.slow_rank:
            data = SlowSamples(*self.data.tensors, sleep=self.sample_read_s)
        return DataLoader(data, batch_size=self.batch_size, sampler=EpochSeededRandomSampler(data, seed=0))

    def val_dataloader(self):
        return DataLoader(self.test, batch_size=32)

    def test_dataloader(self):
        return DataLoader(self.test, batch_size=32)

    def predict_dataloader(self):
        return DataLoader(self.test, batch_size=32)


class RecordingClassifier(ClassifierModule):
    """Records which samples each epoch trained on."""

    def __init__(self, *args, compute_sleep: float = 0.0, sample_sleep: float = 0.0, log_step_sync: bool = False,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log_step_sync = log_step_sync
        self.seen: dict[int, list[int]] = {}
        self.batches: dict[int, list[list[int]]] = {}
        self.compute_sleep = compute_sleep
        self.sample_sleep = sample_sleep

    def training_step(self, batch, batch_idx):
        x, y, idx = batch
        self.seen.setdefault(self.current_epoch, []).extend(idx.tolist())
        self.batches.setdefault(self.current_epoch, []).append(idx.tolist())
        if self.compute_sleep or self.sample_sleep:
            # a slower model's compute: per step for the overlap test, per sample for balanced shares
            time.sleep(self.compute_sleep + self.sample_sleep * len(idx))
        if self.log_step_sync:
            self.log("train/batch_size", float(len(idx)), on_step=True, on_epoch=False, sync_dist=True)
        return super().training_step((x, y), batch_idx)


class SleepAfterStep(pl.Callback):
    """A user's callback that makes one rank slow after each of its training steps (heavy logging, a
    busier host): ``per_sample_s`` seconds for each sample of the batch."""

    def __init__(self, rank: int, per_sample_s: float) -> None:
        self.rank, self.per_sample_s = rank, per_sample_s

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_rank == self.rank:
            time.sleep(self.per_sample_s * len(batch[0]))


class SpellsAfterStep(pl.Callback):
    """A transient straggler: on one rank, about one step in ten (seeded) is followed by a spell of
    ``per_sample_s`` seconds per sample of the batch."""

    def __init__(self, rank: int, per_sample_s: float, chance: float = 0.1) -> None:
        import random

        self.rank, self.per_sample_s, self.chance, self.random = rank, per_sample_s, chance, random.Random(7)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_rank == self.rank and self.random.random() < self.chance:
            time.sleep(self.per_sample_s * len(batch[0]))


class CollectiveCount(pl.Callback):
    """Counts every torch.distributed communication call this rank makes from its first training batch to
    the end of its last (collectives_rank{r}.json: per function, how many on the strategy's exchange group
    and how many elsewhere), between the batches included; what set-up and the sync points issue is not."""

    CALLS = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce",
             "gather", "scatter", "all_to_all", "barrier", "monitored_barrier", "send", "recv", "isend", "irecv",
             "batch_isend_irecv", "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list")

    def __init__(self, out: Path) -> None:
        self.out, self.counting, self.counts, self.snapshot = out, False, {}, {}

    def setup(self, trainer, pl_module, stage):
        import torch.distributed as dist

        for name in self.CALLS:
            original = getattr(dist, name)

            def counted(*args, _name=name, _original=original, **kwargs):
                if self.counting:
                    group = kwargs.get("group")
                    where = "exchange" if group is not None and group is getattr(trainer.strategy, "exchange_group", None) \
                        else "other"
                    key = f"{_name}@{where}"
                    self.counts[key] = self.counts.get(key, 0) + 1
                return _original(*args, **kwargs)

            setattr(dist, name, counted)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.counting = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.snapshot = dict(self.counts)  # the counts up to the end of the newest batch

    def on_train_epoch_end(self, trainer, pl_module):
        self.counting = False
        self.counts = dict(self.snapshot)
        (self.out / f"collectives_rank{trainer.global_rank}.json").write_text(json.dumps(self.snapshot))


class KillAt(pl.Callback):
    """SIGKILLs this process at a given training step (of a given epoch) on a given rank: a crashed worker."""

    def __init__(self, rank: int, step: int, out: Path, epoch: int = 0) -> None:
        self.rank, self.step, self.out, self.epoch = rank, step, out, epoch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_rank == self.rank and batch_idx == self.step and trainer.current_epoch == self.epoch:
            (self.out / "killed_at").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)


class SigtermAt(pl.Callback):
    """Rank 0 sends itself SIGTERM at a given training step (a preempted job); each rank records the
    batches it trained (sigterm_rank{r}.txt)."""

    def __init__(self, step: int, out: Path) -> None:
        self.step, self.out, self.batches = step, out, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_rank == 0 and trainer.current_epoch == 0 and batch_idx == self.step:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches += 1
        (self.out / f"sigterm_rank{trainer.global_rank}.txt").write_text(str(self.batches))


class KillServerAt(pl.Callback):
    """SIGKILLs the parameter server (started by rank 0) at a given training step of rank 0."""

    def __init__(self, step: int, out: Path, shard: int = 0) -> None:
        self.step, self.out, self.shard = step, out, shard

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_rank == 0 and batch_idx == self.step:
            (self.out / "killed_at").write_text(repr(time.time()))
            os.kill(trainer.strategy._servers[self.shard].pid, signal.SIGKILL)


class TrainedBatches(pl.Callback):
    """Appends each trained batch's sample indices to trained_rank{r}.txt as it ends (its optimizer
    step done: for the parameter-server strategies, its gradient received by the server), one line
    "epoch i,j,k", so that the record of a rank that dies is complete up to its death."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        line = f"{trainer.current_epoch} {','.join(map(str, batch[2].tolist()))}\n"
        with open(self.out / f"trained_rank{trainer.global_rank}.txt", "a") as f:
            f.write(line)


class ValidationRecord(pl.Callback):
    """Records, at each validation of a fit, the epoch and the model's parameters (validations_rank{r}.pt),
    and the parameters of each checkpoint saved (saved_rank{r}.pt)."""

    def __init__(self, out: Path) -> None:
        self.out, self.records, self.saved = out, [], []

    def on_validation_start(self, trainer, pl_module):
        if trainer.state.fn == "fit":
            self.records.append((trainer.current_epoch, torch.cat([p.detach().flatten() for p in pl_module.parameters()])))

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self.saved.append(torch.cat([v.flatten() for v in checkpoint["state_dict"].values()]))

    def on_fit_end(self, trainer, pl_module):
        torch.save(self.records, self.out / f"validations_rank{trainer.global_rank}.pt")
        torch.save(self.saved, self.out / f"saved_rank{trainer.global_rank}.pt")


class PidFiles(pl.Callback):
    """Writes each rank's pid (pid_rank{r}) and the parameter server's (pid_server) into a folder."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def on_fit_start(self, trainer, pl_module):
        (self.out / f"pid_rank{trainer.global_rank}").write_text(str(os.getpid()))
        for shard, server in enumerate(getattr(trainer.strategy, "_servers", [])):
            (self.out / f"pid_server{shard or ''}").write_text(str(server.pid))


class OutOfMemoryAt(pl.Callback):
    """Asks for far more memory than any device has, at a given training step on a given rank."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_rank == self.rank and batch_idx == self.step:
            torch.empty(1 << 50, dtype=torch.uint8, device=pl_module.device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--staleness", type=float, default=3)
    parser.add_argument("--sync", default="delay")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=1, help="Trainer num_nodes (under torchrun --nnodes)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--noise", type=float, default=1.0, help="synthetic data: noise around the class prototypes")
    parser.add_argument("--test-samples", type=int, default=128)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--weight-decay", type=float, default=0.0, help="SGD weight_decay")
    parser.add_argument("--freeze-first-layer", action="store_true",
                        help="requires_grad_(False) on the MLP's first layer (still handed to the optimizer)")
    parser.add_argument("--slowdown", default=None, help="comma-separated factors per rank")
    parser.add_argument("--sim-where", default="compute", help="HeterogeneitySimulator(where=...) for --slowdown")
    parser.add_argument("--slow-rank", type=int, default=None, help="a user's own slowness on this rank (see --slow-by)")
    parser.add_argument("--slow-by", default="callback",
                        help="callback: a callback sleeps after each step; data: its dataset sleeps per sample read; "
                             "spells: a callback sleeps after one step in ten")
    parser.add_argument("--slow-per-sample", type=float, default=0.0, help="seconds the slow rank loses per sample")
    parser.add_argument("--checkpoint-dir", type=Path, default=None)
    parser.add_argument("--checkpoint-every-steps", type=int, default=0, help="with --checkpoint-dir: every_n_train_steps")
    parser.add_argument("--resume", default=None)
    parser.add_argument("--kill-rank", type=int, default=None)
    parser.add_argument("--kill-step", type=int, default=3)
    parser.add_argument("--kill-epoch", type=int, default=0)
    parser.add_argument("--on-worker-failure", default="stop", help="parameter-server strategies")
    parser.add_argument("--record-batches", action="store_true", help="append trained batches to trained_rank{r}.txt")
    parser.add_argument("--kill-server-step", type=int, default=None, help="rank 0 SIGKILLs the parameter server then")
    parser.add_argument("--sigterm-step", type=int, default=None, help="rank 0 sends itself SIGTERM at this step")
    parser.add_argument("--count-collectives", action="store_true", help="CollectiveCount: collectives_rank{r}.json")
    parser.add_argument("--oom-rank", type=int, default=None, help="this rank runs out of memory at --oom-step")
    parser.add_argument("--oom-step", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--clip", type=float, default=None, help="gradient_clip_val")
    parser.add_argument("--accumulate", type=int, default=1, help="accumulate_grad_batches")
    parser.add_argument("--overfit-batches", type=int, default=0, help="overfit_batches")
    parser.add_argument("--fast-dev-run", action="store_true", help="fast_dev_run=True")
    parser.add_argument("--check-val-every", type=int, default=1, help="check_val_every_n_epoch")
    parser.add_argument("--val-check-interval", default="1.0", help="val_check_interval (a fraction, or batches)")
    parser.add_argument("--limit-val-batches", type=int, default=1)
    parser.add_argument("--limit-train-batches", default="1.0", help="limit_train_batches (a fraction, or batches)")
    parser.add_argument("--log-step-sync", action="store_true", help="self.log(on_step=True, sync_dist=True) each step")
    parser.add_argument("--scheduler", action="store_true", help="StepLR(step_size=1, gamma=0.5) per epoch")
    parser.add_argument("--step-scheduler", action="store_true", help="StepLR(step_size=1, gamma=0.5) per step")
    parser.add_argument("--delay", type=int, default=1, help="DelayedAveragingStrategy / LocalSGDStrategy delay")
    parser.add_argument("--sync-every", type=int, default=4, help="LocalSGDStrategy sync_every")
    parser.add_argument("--outer", default="average", help="LocalSGDStrategy outer_optimizer")
    parser.add_argument("--fragments", type=int, default=1, help="LocalSGDStrategy fragments")
    parser.add_argument("--compensation", default=None)
    parser.add_argument("--method", default="dga", help="DelayedAveragingStrategy method: dga | pipe_sgd")
    parser.add_argument("--adam", action="store_true", help="Adam (lr --lr) instead of SGD")
    parser.add_argument("--momentum-correction", default=None, help="DelayedAveragingStrategy: none (default here) | mean_delay | subtract")
    parser.add_argument("--dc-lambda", type=float, default=0.04)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="sim collective_latency_s")
    parser.add_argument("--compute-sleep", type=float, default=0.0, help="seconds of simulated compute per step")
    parser.add_argument("--straggler-report", action="store_true", help="StragglerReport; its findings to straggler.json")
    parser.add_argument("--sample-sleep", type=float, default=0.0, help="seconds of simulated compute per sample")
    parser.add_argument("--global-batch", type=int, default=None, help="balanced: samples per step over all ranks")
    parser.add_argument("--speeds", default=None, help="balanced: comma-separated relative speeds per rank")
    parser.add_argument("--measure-steps", type=int, default=10, help="balanced: steps measured before balancing")
    parser.add_argument("--rebalance-every", type=int, default=0, help="balanced: rebalance every N steps (0: never)")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--processes-per-device", type=int, default=1, help="our strategies: processes on each device")
    parser.add_argument("--fork-ranks", action="store_true", help="our strategies: fork_ranks=True")
    parser.add_argument("--slow-server-stop", type=float, default=0.0,
                        help="parameter-server strategies: rank 0 waits this long before it ends the server")
    parser.add_argument("--transport", default="auto", help="parameter-server strategies: auto | channel")
    parser.add_argument("--wire-dtype", default="fp32", help="parameter-server strategies: fp32 | bf16")
    parser.add_argument("--server-device", default="cpu", help="parameter-server strategies: server_device")
    parser.add_argument("--step-patience", type=float, default=1.0, help="SSPStrategy step_patience")
    parser.add_argument("--servers", default="1", help="parameter-server strategies: server shards (a number, or auto)")
    parser.add_argument("--kill-shard", type=int, default=0, help="with --kill-server-step: which server shard")
    parser.add_argument("--bf16-initial", action="store_true", help="start from parameters rounded to bf16")
    args = parser.parse_args()
    torch.set_num_threads(threads_per_process(args.devices * args.processes_per_device))

    pl.seed_everything(0)
    strategy = args.strategy
    shared = {"processes_per_device": args.processes_per_device, "fork_ranks": args.fork_ranks}
    servers = args.servers if args.servers == "auto" else int(args.servers)
    if strategy == "ssp":
        strategy = SSPStrategy(staleness=args.staleness, sync=args.sync, timeout=args.timeout,
                               on_worker_failure=args.on_worker_failure, transport=args.transport,
                               wire_dtype=args.wire_dtype, servers=servers, server_device=args.server_device,
                               step_patience=args.step_patience,
                               **shared)
    elif strategy == "cneural":
        strategy = CNeuralStrategy(timeout=args.timeout, on_worker_failure=args.on_worker_failure,
                                   transport=args.transport, wire_dtype=args.wire_dtype, servers=servers,
                                   server_device=args.server_device, **shared)
    elif strategy == "asgd":
        strategy = DelayedAveragingStrategy(
            delay=args.delay, method=args.method, compensation=args.compensation, dc_lambda=args.dc_lambda,
            warmup_steps=args.warmup,
            momentum_correction=args.momentum_correction,
            **shared,
        )
    elif strategy == "local_sgd":
        strategy = LocalSGDStrategy(sync_every=args.sync_every, delay=args.delay, outer_optimizer=args.outer,
                                    fragments=args.fragments, **shared)
    elif strategy == "balanced":
        strategy = BalancedDataParallelStrategy(
            global_batch=args.global_batch, speeds=[float(s) for s in args.speeds.split(",")] if args.speeds else None,
            measure_steps=args.measure_steps, rebalance_every=args.rebalance_every, **shared,
        )
    if args.slow_server_stop:  # the other workers may leave first: the server must not take that for a death
        stop_server = strategy._stop_server

        def slow_stop_server(*a, **k):
            time.sleep(args.slow_server_stop)
            return stop_server(*a, **k)

        strategy._stop_server = slow_stop_server
    callbacks = []
    if args.slowdown or args.latency:
        slowdown = [float(f) for f in args.slowdown.split(",")] if args.slowdown else None
        callbacks.append(HeterogeneitySimulator(slowdown=slowdown, collective_latency_s=args.latency, where=args.sim_where))
    if args.slow_rank is not None and args.slow_by == "callback":
        callbacks.append(SleepAfterStep(args.slow_rank, args.slow_per_sample))
    if args.slow_rank is not None and args.slow_by == "spells":
        callbacks.append(SpellsAfterStep(args.slow_rank, args.slow_per_sample))
    report = StragglerReport() if args.straggler_report else None
    if report is not None:
        callbacks.append(report)
    timer = EpochTimer()
    callbacks.append(timer)
    callbacks.append(PidFiles(args.out))
    if args.kill_rank is not None:
        callbacks.append(KillAt(args.kill_rank, args.kill_step, args.out, args.kill_epoch))
    if args.record_batches:
        callbacks.append(TrainedBatches(args.out))
    callbacks.append(ValidationRecord(args.out))
    val_check_interval = float(args.val_check_interval) if "." in args.val_check_interval else int(args.val_check_interval)
    if args.kill_server_step is not None:
        callbacks.append(KillServerAt(args.kill_server_step, args.out, args.kill_shard))
    if args.sigterm_step is not None:
        callbacks.append(SigtermAt(args.sigterm_step, args.out))
    if args.count_collectives:
        callbacks.append(CollectiveCount(args.out))
    if args.oom_rank is not None:
        callbacks.append(OutOfMemoryAt(args.oom_rank, args.oom_step))
    if args.checkpoint_dir:
        if args.checkpoint_every_steps:
            callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=args.checkpoint_dir, save_top_k=-1, filename="{step}",
                                                          every_n_train_steps=args.checkpoint_every_steps))
        else:
            callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=args.checkpoint_dir, save_top_k=-1, filename="{epoch}"))
    scheduler = partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5) if args.scheduler else None
    if args.step_scheduler:
        scheduler = {"scheduler": partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5), "interval": "step"}
    module = RecordingClassifier(
        MLP(activation="relu"), scheduler=scheduler,
        optimizer=partial(torch.optim.Adam, lr=args.lr) if args.adam else partial(
            torch.optim.SGD, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay),
        compute_sleep=args.compute_sleep, sample_sleep=args.sample_sleep, log_step_sync=args.log_step_sync,
    )
    if args.freeze_first_layer:  # a frozen layer the user's configure_optimizers still hands to SGD (all parameters)
        module.net.hidden0.requires_grad_(False)
    if args.bf16_initial:
        with torch.no_grad():
            for p in module.parameters():
                p.copy_(p.bfloat16())
    torch.save({k: v.detach().clone() for k, v in module.state_dict().items()}, args.out / "initial.pt")
    trainer = pl.Trainer(
        accelerator=args.accelerator, devices=args.devices, num_nodes=args.num_nodes, strategy=strategy,
        max_epochs=args.epochs,
        max_steps=args.max_steps, logger=False,
        enable_checkpointing=bool(args.checkpoint_dir), enable_progress_bar=False, enable_model_summary=False,
        callbacks=callbacks, num_sanity_val_steps=0, limit_val_batches=args.limit_val_batches, gradient_clip_val=args.clip,
        limit_train_batches=float(args.limit_train_batches) if "." in args.limit_train_batches else int(args.limit_train_batches),
        accumulate_grad_batches=args.accumulate, precision=args.precision, overfit_batches=args.overfit_batches,
        fast_dev_run=args.fast_dev_run, check_val_every_n_epoch=args.check_val_every, val_check_interval=val_check_interval,
    )
    data = IndexedData(args.batch_size, args.samples, args.noise, args.test_samples,
                       slow_rank=args.slow_rank if args.slow_by == "data" else None, sample_read_s=args.slow_per_sample)
    trainer.fit(module, datamodule=data, ckpt_path=args.resume)
    if report is not None and trainer.is_global_zero:
        (args.out / "straggler.json").write_text(json.dumps([asdict(f) for f in report.findings]))
        if report.regime is not None:
            (args.out / "regime.json").write_text(json.dumps(asdict(report.regime)))
    rank = trainer.global_rank
    if isinstance(strategy, BalancedDataParallelStrategy):
        torch.save(module.batches, args.out / f"batches_rank{rank}.pt")
        if trainer.is_global_zero:
            logged = {k: float(v) for k, v in trainer.logged_metrics.items() if k.startswith("balanced/")}
            balanced = {"changes": strategy.share_changes, "history": strategy.history, "logged": logged}
            (args.out / "balanced.json").write_text(json.dumps(balanced))
    torch.save({k: v.detach().clone() for k, v in module.state_dict().items()}, args.out / f"rank{rank}.pt")
    torch.save(module.seen, args.out / f"indices_rank{rank}.pt")
    if isinstance(strategy, ParameterServerStrategy):
        (args.out / f"transport_rank{rank}.txt").write_text(str(strategy.transport_used))
    if isinstance(strategy, ParameterServerStrategy) and trainer.is_global_zero:
        history = [[asdict(s) for s in epoch] for epoch in strategy.history]
        (args.out / "ssp_history.json").write_text(json.dumps(history))
    (result,) = trainer.test(module, datamodule=data, verbose=False)
    (validated,) = trainer.validate(module, datamodule=data, verbose=False)
    predictions = torch.cat(trainer.predict(module, datamodule=data))
    if trainer.is_global_zero:
        (args.out / "test_acc.txt").write_text(str(result["test/acc"]))
        summary = {
            "val_acc": validated["val/acc"], "predictions": predictions.numel(), "global_step": trainer.global_step,
            "lr": trainer.optimizers[0].param_groups[0]["lr"], "epoch_times": timer.epoch_times,
            "momentum": trainer.optimizers[0].param_groups[0].get("momentum"),
        }
        if isinstance(strategy, DelayedAveragingStrategy):
            summary.update(pushed=strategy.pushed, applied=strategy.applied)
        (args.out / "summary.json").write_text(json.dumps(summary))
    # Without this, torch 2.13's gloo sometimes aborts a rank at interpreter exit after trainer.test
    # ("terminate called without an active exception"); the lightning-hybrid CLI does the same.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
