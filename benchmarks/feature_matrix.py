"""Lightning features x strategies: does each feature run, and does it do what it says?

Each case is a small fit (an MLP on 64 synthetic samples, batch 8, 2 CPU processes) with one
Trainer feature switched on, run in a process of its own (``--case STRATEGY FEATURE``). Every rank
records what happened (epochs, batches per epoch, validations, learning rates, logged values,
checkpoints, and the counts Lightning keeps: ``global_step``, scheduler steps, the step of each
checkpoint saved) and the weights it trained; the driver checks that against what the feature means,
compares the counts with what DDP did for the same Trainer arguments (:data:`COUNTS`; under cNeural,
whose step is a pass, with DDP accumulating gradients over each epoch; under the parameter server,
whose workers are dealt different numbers of batches, the batches of all ranks together), and compares
the trained weights with DDP's: equal to 1e-5 for the settings that promise DDP's result
(:data:`VALUES_EXACT`: ``delay=0``, ``staleness=0``, balanced shares, the pipeline, cNeural), and the
largest difference reported beside the cell for the others (``ok (Δ 4e-3)``: asynchrony on). It prints
one cell per case:

* ``ok``: it ran and the check passed (and, where promised, the weights are DDP's);
* ``refused``: an error before any other process started, with the message's start (a case is only
  "refused" if the second process was never started);
* ``warned``: it ran, the check failed, and the strategy said why in a warning;
* ``WRONG``: it ran but the check failed (silently wrong: the worst outcome);
* ``refused at use``: one of our strategies' errors when the feature is first used (a step-level
  ``sync_dist`` cannot be seen before ``training_step`` runs);
* ``failed``: any other error after the processes started.

    python benchmarks/feature_matrix.py                      # every strategy x every feature
    python benchmarks/feature_matrix.py --strategies ssp --features max_steps fast_dev_run

Our strategies fork their ranks (``fork_ranks=True``: the same run as a rerun script, faster);
Lightning's DDP reruns the script. Writes benchmarks/results/feature_matrix.md and .json
(``--namespace lightning``: every case on ``import lightning``; feature_matrix_lightning.md and .json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

STRATEGY_CLASSES = {
    "ssp": "SSPStrategy", "ssp_s0": "SSPStrategy", "ssp_async": "SSPStrategy", "cneural": "CNeuralStrategy",
    "delayed_averaging": "DelayedAveragingStrategy", "delayed_averaging_d0": "DelayedAveragingStrategy",
    "local_sgd": "LocalSGDStrategy", "balanced": "BalancedDataParallelStrategy",
    "hybrid": "HybridParallelStrategy", "partitioned_inference": "PartitionedInferenceStrategy",
}
STRATEGIES = ["ddp", "ssp", "ssp_s0", "ssp_async", "cneural", "delayed_averaging", "delayed_averaging_d0", "local_sgd",
              "balanced", "hybrid", "partitioned_inference"]
#: Settings that promise DDP's result (its trained weights, to 1e-5, for every feature that trains; in bf16 to its
#: rounding, 5e-3: balanced shares weigh each rank's loss by its share, and the pipeline sums two micro-batches,
#: which bf16 rounds otherwise than DDP's mean of one batch: 1.1e-4 and 1.8e-3 measured).
VALUES_EXACT = ("ssp_s0", "cneural", "delayed_averaging_d0", "balanced", "hybrid")
TOLERANCE = {"bf16_mixed": 5e-3}
EPOCHS, SAMPLES, BATCH, LR = 2, 64, 8, 0.1

# feature -> (Trainer keyword arguments, what it means: checked by CHECKS)
FEATURES: dict[str, dict] = {
    "max_epochs": {},
    "max_steps": {"max_steps": 5, "max_epochs": 10},
    "fast_dev_run": {"fast_dev_run": True},
    "limit_train_batches": {"limit_train_batches": 2},
    "limit_train_batches_fraction": {"limit_train_batches": 0.5},
    "limit_val_batches": {"limit_val_batches": 1},
    "val_check_interval": {"val_check_interval": 2},
    "check_val_every_n_epoch": {"check_val_every_n_epoch": 2},
    "num_sanity_val_steps": {"num_sanity_val_steps": 2},
    "overfit_batches": {"overfit_batches": 2},
    "accumulate_grad_batches": {"accumulate_grad_batches": 2},
    "gradient_clip_val": {"gradient_clip_val": 0.01},
    "bf16_mixed": {"precision": "bf16-mixed"},
    "epoch_lr_scheduler": {},
    "step_lr_scheduler": {},
    "checkpoint_every_epoch": {"enable_checkpointing": True},
    "checkpoint_every_n_steps": {"enable_checkpointing": True},
    "resume_from_checkpoint": {"enable_checkpointing": True},
    "early_stopping": {"max_epochs": 6},
    "log_epoch_sync_dist": {},
    "log_step_sync_dist": {},
    "manual_optimization": {},
    "two_optimizers": {},
    "validate_test_predict": {},
    "lr_monitor_csv_logger": {},
}


# ---------------------------------------------------------------------------------------- one case
def run_case(strategy_name: str, feature: str, out: Path, namespace: str = "pytorch_lightning") -> None:
    import importlib

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    # The Trainer, the module and our classes from one Lightning namespace (docs/python.md).
    pl = importlib.import_module("lightning.pytorch" if namespace == "lightning" else "pytorch_lightning")
    ours = importlib.import_module("lightning_hybrid.lightning" if namespace == "lightning" else "lightning_hybrid")
    DelayedAveragingStrategy, BalancedDataParallelStrategy, CNeuralStrategy, LocalSGDStrategy = (
        ours.DelayedAveragingStrategy, ours.BalancedDataParallelStrategy, ours.CNeuralStrategy, ours.LocalSGDStrategy)
    HybridParallelStrategy, PartitionedInferenceStrategy, SSPStrategy = (
        ours.HybridParallelStrategy, ours.PartitionedInferenceStrategy, ours.SSPStrategy)

    torch.set_num_threads(1)
    pl.seed_everything(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 1, 4, 4, generator=g)
    y = (x.flatten(1).sum(1) > 0).long()

    class Probe(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(64, 2))
            self.loss_fn = nn.CrossEntropyLoss()
            self.automatic_optimization = feature not in ("manual_optimization", "two_optimizers")

        def forward(self, inputs):
            return self.net(inputs)

        def training_step(self, batch, batch_idx):
            inputs, targets = batch
            loss = self.loss_fn(self(inputs), targets)
            if feature == "log_epoch_sync_dist":
                self.log("rank_mean", float(self.global_rank), on_step=False, on_epoch=True, sync_dist=True)
            if feature == "log_step_sync_dist":
                self.log("rank_step", float(self.global_rank), on_step=True, on_epoch=False, sync_dist=True)
            if not self.automatic_optimization:
                for opt in (self.optimizers() if feature == "two_optimizers" else [self.optimizers()]):
                    opt.zero_grad()
                self.manual_backward(loss)
                for opt in (self.optimizers() if feature == "two_optimizers" else [self.optimizers()]):
                    opt.step()
                return None
            return loss

        def validation_step(self, batch, batch_idx):
            inputs, targets = batch
            self.log("val_loss", self.loss_fn(self(inputs), targets), sync_dist=True)

        def test_step(self, batch, batch_idx):
            inputs, targets = batch
            self.log("test_acc", (self(inputs).argmax(1) == targets).float().mean(), sync_dist=True)

        def predict_step(self, batch, batch_idx):
            return self(batch[0])

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=LR)
            if feature == "two_optimizers":
                return opt, torch.optim.SGD(self.parameters(), lr=LR)
            if feature == "epoch_lr_scheduler":
                return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)}
            if feature == "step_lr_scheduler":
                scheduler = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.9)
                return {"optimizer": opt, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
            return opt

        def lr_scheduler_step(self, scheduler, metric):
            self.scheduler_steps += 1
            super().lr_scheduler_step(scheduler, metric)

        def on_save_checkpoint(self, checkpoint):
            self.checkpoint_steps.append(self.trainer.global_step)

    class Data(pl.LightningDataModule):
        def _loader(self):
            return DataLoader(TensorDataset(x, y), batch_size=BATCH)

        def train_dataloader(self):
            if strategy_name == "single":  # the order Lightning's distributed sampler gives one replica (shuffled)
                data = TensorDataset(x, y)
                sampler = torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)
                return DataLoader(data, batch_size=BATCH, sampler=sampler)
            return self._loader()

        def val_dataloader(self):
            return self._loader()

        test_dataloader = predict_dataloader = val_dataloader

    class Recorder(pl.Callback):
        def __init__(self) -> None:
            self.batches: list[list[float]] = []
            self.samples: list[list[float]] = []
            self.lrs: list[float] = []
            self.validations = self.val_batches = self.sanity_batches = 0

        def on_train_epoch_start(self, trainer, pl_module):
            self.batches.append([])
            self.samples.append([])
            self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.batches[-1].append(round(float(batch[0].sum()), 4))
            self.samples[-1] += [round(float(v), 4) for v in batch[0].flatten(1).sum(1)]  # a sample's identity

        def on_validation_batch_end(self, trainer, *args):
            if trainer.sanity_checking:
                self.sanity_batches += 1
            else:
                self.val_batches += 1

        def on_validation_epoch_end(self, trainer, pl_module):
            if not trainer.sanity_checking:
                self.validations += 1

    factories = {
        "ddp": lambda: "ddp",
        "ddp_per_epoch": lambda: "ddp",
        "single": lambda: "auto",
        "ssp": lambda: SSPStrategy(staleness=3, fork_ranks=True, timeout=60),
        "ssp_s0": lambda: SSPStrategy(staleness=0, fork_ranks=True, timeout=60),
        "ssp_async": lambda: SSPStrategy(staleness=math.inf, fork_ranks=True, timeout=60),
        "cneural": lambda: CNeuralStrategy(fork_ranks=True, timeout=60),
        "delayed_averaging": lambda: DelayedAveragingStrategy(delay=1, fork_ranks=True),
        "delayed_averaging_d0": lambda: DelayedAveragingStrategy(delay=0, fork_ranks=True),
        "local_sgd": lambda: LocalSGDStrategy(sync_every=4, fork_ranks=True),
        "balanced": lambda: BalancedDataParallelStrategy(measure_steps=2, fork_ranks=True),
        "hybrid": lambda: HybridParallelStrategy(pipeline_stages=2, devices=[1.0, 1.0], micro_batches=2,
                                                 fork_ranks=True),
        "partitioned_inference": lambda: PartitionedInferenceStrategy(abilities=[1.0, 1.0], fork_ranks=True),
    }
    recorder = Recorder()
    callbacks: list = [recorder]
    if feature == "checkpoint_every_epoch":
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=out / "ckpt", save_top_k=-1, filename="{epoch}"))
    if feature == "checkpoint_every_n_steps":
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=out / "ckpt", save_top_k=-1, every_n_train_steps=2,
                                                      filename="{step}"))
    if feature == "resume_from_checkpoint":
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=out / "ckpt", save_top_k=-1, filename="{epoch}"))
    if feature == "early_stopping":
        callbacks.append(pl.callbacks.EarlyStopping(monitor="val_loss", patience=0, min_delta=10.0))
    if feature == "lr_monitor_csv_logger":
        callbacks.append(pl.callbacks.LearningRateMonitor())
    kwargs = {
        "accelerator": "cpu", "devices": 2, "max_epochs": EPOCHS, "logger": False, "enable_checkpointing": False,
        "enable_progress_bar": False, "enable_model_summary": False, "num_sanity_val_steps": 0,
        "default_root_dir": out,  # Lightning's own checkpoints (the resumed run's) go there, not into the cwd
        **FEATURES[feature],
    }
    if feature == "lr_monitor_csv_logger":
        kwargs["logger"] = pl.loggers.CSVLogger(out, name="csv", version=0)
    if feature == "resume_from_checkpoint":
        kwargs["max_epochs"] = 1
    if strategy_name == "ddp_per_epoch":  # cNeural's reference: one step per epoch (DDP accumulating over it)
        # as many batches as the epoch has: Lightning divides each batch's loss by accumulate_grad_batches
        per_epoch = {"limit_train_batches": 2, "limit_train_batches_fraction": 2, "overfit_batches": 2, "fast_dev_run": 1}
        kwargs["accumulate_grad_batches"] = per_epoch.get(feature, SAMPLES // BATCH // 2)
    if strategy_name == "single":  # the pipeline's reference (one data-parallel replica: the whole batch of 8)
        kwargs["devices"] = 1
    record: dict = {}
    module, data = Probe(), Data()
    module.scheduler_steps, module.checkpoint_steps = 0, []
    trainer = pl.Trainer(strategy=factories[strategy_name](), callbacks=callbacks, **kwargs)
    try:
        if strategy_name == "partitioned_inference" or feature == "validate_test_predict":
            if strategy_name != "partitioned_inference":
                trainer.fit(module, datamodule=data)
            record["validate"] = trainer.validate(module, datamodule=data, verbose=False)
            record["test"] = trainer.test(module, datamodule=data, verbose=False)
            record["predictions"] = sum(len(p) for p in trainer.predict(module, datamodule=data))
        else:
            trainer.fit(module, datamodule=data)
            if feature == "resume_from_checkpoint":
                first_epochs = len(recorder.batches)
                recorder.batches.clear()
                resumed = pl.Trainer(strategy=factories[strategy_name](), callbacks=[recorder], **{**kwargs, "max_epochs": 3})
                resumed.fit(module, datamodule=data, ckpt_path=str(out / "ckpt" / "epoch=0.ckpt"))
                record["first_epochs"] = first_epochs
                trainer = resumed
    except Exception as err:  # noqa: BLE001 - the matrix reports every error
        started = os.environ.get("LOCAL_RANK") is not None
        if not started or trainer.global_rank == 0:
            (out / "error.json").write_text(json.dumps({"started": started, "type": type(err).__name__,
                                                        "message": str(err)}))
        raise
    (out / f"samples_rank{trainer.global_rank}.json").write_text(json.dumps(recorder.samples))
    counts = {"global_step": trainer.global_step, "epochs": len(recorder.batches), "validations": recorder.validations,
              "scheduler_steps": module.scheduler_steps, "checkpoint_steps": module.checkpoint_steps,
              "batches": [len(b) for b in recorder.batches]}
    (out / f"counts_rank{trainer.global_rank}.json").write_text(json.dumps(counts))
    if strategy_name != "partitioned_inference":  # what it trained (a pipeline rank: its stage's tensors)
        weights = {k: v.detach().cpu() for k, v in module.state_dict().items() if v.device.type != "meta"}
        torch.save(weights, out / f"weights_rank{trainer.global_rank}.pt")
    if trainer.global_rank != 0:
        return
    record.update(
        current_epoch=trainer.current_epoch, global_step=trainer.global_step, batches=recorder.batches,
        lrs=recorder.lrs, lr_end=trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else None,
        validations=recorder.validations, val_batches=recorder.val_batches, sanity_batches=recorder.sanity_batches,
        logged={k: float(v) for k, v in trainer.logged_metrics.items()},
        checkpoints=sorted(p.name for p in (out / "ckpt").glob("*.ckpt")) if (out / "ckpt").exists() else [],
        csv_columns=(out / "csv" / "version_0" / "metrics.csv").read_text().splitlines()[0].split(",")
        if (out / "csv" / "version_0" / "metrics.csv").exists() else [],
    )
    (out / "record.json").write_text(json.dumps(record))


# ------------------------------------------------------------------------------------ the checks
def check(strategy: str, feature: str, r: dict, all_samples: list[list[list[float]]]) -> str | None:
    """None when the record (rank 0's) and the samples every rank trained on, epoch by epoch, show
    the feature doing what it means, else what is wrong."""
    per_epoch = [len(b) for b in r.get("batches", [])]

    def expect(condition: bool, what: str) -> str | None:
        return None if condition else what

    match feature:
        case "max_epochs":
            return expect(r["current_epoch"] == EPOCHS and len(per_epoch) == EPOCHS, f"epochs {per_epoch}")
        case "max_steps" if strategy == "cneural":  # batch mode: a step is a pass
            return expect(r["current_epoch"] == 5 and r["global_step"] == 5, f"stopped at epoch {r['current_epoch']}, "
                          f"step {r['global_step']}")
        case "max_steps":
            return expect(r["current_epoch"] < 10 and r["global_step"] == 5, f"stopped at epoch {r['current_epoch']}, "
                          f"step {r['global_step']}")
        case "fast_dev_run":
            return expect(per_epoch == [1] and r["validations"] == 1, f"batches {per_epoch}, validations {r['validations']}")
        case "limit_train_batches" | "limit_train_batches_fraction" if strategy in DEALT:  # all ranks: 2 each
            totals = [sum(len(rank[e]) for rank in all_samples) for e in range(len(all_samples[0]))]
            return expect(all(t == 2 * 2 * BATCH for t in totals), f"samples per epoch, all ranks {totals}")
        case "limit_train_batches":  # 2 batches
            return expect(all(n <= 2 for n in per_epoch), f"batches per epoch {per_epoch}")
        case "limit_train_batches_fraction":  # half of each rank's: 4 batches of 8 (the pipeline: one replica) or 2 of 4
            replicas = 1 if strategy == "hybrid" else 2
            return expect(all(n <= SAMPLES // BATCH // replicas // 2 for n in per_epoch), f"batches per epoch {per_epoch}")
        case "limit_val_batches":
            return expect(r["val_batches"] == r["validations"], f"{r['val_batches']} batches in {r['validations']} runs")
        case "val_check_interval":
            return expect(r["validations"] > EPOCHS, f"{r['validations']} validations in {EPOCHS} epochs")
        case "check_val_every_n_epoch":
            return expect(r["validations"] == 1, f"{r['validations']} validations")
        case "num_sanity_val_steps":
            return expect(r["sanity_batches"] > 0, "no sanity check")
        case "overfit_batches":  # the same samples every epoch, over all ranks (shares and dealing may vary)
            epochs = [tuple(sorted(x for rank in all_samples for x in rank[e])) for e in range(len(all_samples[0]))]
            return expect(len(set(epochs)) == 1, "different samples in different epochs")
        case "epoch_lr_scheduler":
            return expect(r["lrs"] == [LR * 0.5**e for e in range(EPOCHS)], f"epoch learning rates {r['lrs']}")
        case "step_lr_scheduler":  # one scheduler step per optimizer update
            return expect(r["lr_end"] is not None and math.isclose(r["lr_end"], LR * 0.9 ** r["global_step"]),
                          f"final rate {r['lr_end']} after {r['global_step']} steps")
        case "checkpoint_every_epoch":
            return expect(len(r["checkpoints"]) == EPOCHS, f"checkpoints {r['checkpoints']}")
        case "checkpoint_every_n_steps":
            return expect(len(r["checkpoints"]) >= 1, "no checkpoint")
        case "resume_from_checkpoint":
            return expect(r["current_epoch"] == 3 and len(r["batches"]) == 2, f"resumed: epochs {per_epoch}")
        case "early_stopping":
            return expect(r["current_epoch"] < 6, f"ran {r['current_epoch']} of 6 epochs")
        case "log_epoch_sync_dist" | "log_step_sync_dist":  # ranks log 0 and 1: a mean over ranks (by samples)
            value = r["logged"].get("rank_mean" if feature == "log_epoch_sync_dist" else "rank_step")
            return expect(value is not None and 0 < value < 1, f"logged {value}")
        case "validate_test_predict":
            return expect(bool(r["validate"]) and bool(r["test"]) and r["predictions"] > 0, "no results")
        case "lr_monitor_csv_logger":
            return expect(any(c.startswith("lr-") for c in r["csv_columns"]), f"columns {r['csv_columns']}")
        case _:  # ran: nothing more to check (accumulation, clipping, bf16, manual optimization)
            return None


#: What each strategy's counts are compared with: the same Trainer arguments under DDP (a step is a
#: global batch), under DDP accumulating over each epoch (cNeural: a step is a pass) and in one
#: process (the pipeline: one data-parallel replica).
REFERENCE = {"cneural": "ddp_per_epoch", "hybrid": "single"}
#: The counts compared, exactly.
COUNTS = ("global_step", "epochs", "validations", "scheduler_steps", "checkpoint_steps")
#: Strategies whose workers are dealt batches as they ask (compared: all ranks' batches together).
DEALT = ("ssp", "ssp_s0", "ssp_async")


def count_differences(strategy: str, feature: str, mine: list[dict], ref: list[dict]) -> str | None:
    """What differs between a case's counts (one dict per rank) and its reference's, or None."""
    problems = [f"{key} {mine[0][key]} ({REFERENCE.get(strategy, 'ddp')}: {ref[0][key]})"
                for key in COUNTS if mine[0][key] != ref[0][key]]
    steps = [c["global_step"] for c in mine]
    if len(set(steps)) > 1:
        problems.append(f"ranks end at different steps {steps}")
    if strategy in DEALT:
        # The server deals the epoch's batches: all ranks together train what DDP's ranks do. Under a step limit
        # more: a server step takes a push per worker, and a stale push counts for less (the update rule).
        got = [sum(c["batches"][e] for c in mine if e < len(c["batches"])) for e in range(mine[0]["epochs"])]
        want = [sum(c["batches"][e] for c in ref if e < len(c["batches"])) for e in range(ref[0]["epochs"])]
        limited = feature in ("max_steps", "fast_dev_run")
        if len(got) != len(want) or any(g < w if limited else g != w for g, w in zip(got, want)):
            problems.append(f"batches per epoch, all ranks {got} ({want})")
    else:
        # The pipeline's ranks (its stages) each see every batch of the one process it is compared with.
        want = [ref[0]["batches"]] * len(mine) if REFERENCE.get(strategy) == "single" else [c["batches"] for c in ref]
        if [c["batches"] for c in mine] != want[: len(mine)]:
            problems.append(f"batches per epoch per rank {[c['batches'] for c in mine]} ({want})")
    return "; ".join(problems) or None


def read_weights(out: Path) -> dict | None:
    """The trained model of a case: each tensor from a rank that holds it (None: nothing trained)."""
    import torch

    weights: dict = {}
    for f in sorted(out.glob("weights_rank*.pt")):
        for name, value in torch.load(f).items():
            weights.setdefault(name, value)
    return weights or None


def weight_difference(mine: dict | None, ref: dict | None) -> float | None:
    """The largest difference between a case's trained weights and its reference's (None where either has none)."""
    if not mine or not ref or mine.keys() != ref.keys():
        return None
    return max(float((mine[k].float() - ref[k].float()).abs().max()) for k in ref)


def read_counts(out: Path) -> list[dict] | None:
    files = sorted(out.glob("counts_rank*.json"))
    return [json.loads(f.read_text()) for f in files] if files else None


def classify(strategy: str, feature: str, out: Path, proc: subprocess.CompletedProcess,
             reference: list[dict] | None = None, reference_weights: dict | None = None) -> tuple[str, str]:
    if proc.returncode != 0 or not (out / "record.json").exists():
        error = json.loads((out / "error.json").read_text()) if (out / "error.json").exists() else None
        if error and not error["started"]:
            return "refused", error["message"].split(". ")[0][:160]
        tail = (error["message"] if error else proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "")
        if error and error["message"].startswith(STRATEGY_CLASSES.get(strategy, "?")):
            return "refused at use", tail.split(". ")[0][:160]  # our own error at the feature's first use
        return "failed", tail[:200]
    all_samples = [json.loads(p.read_text()) for p in sorted(out.glob("samples_rank*.json"))]
    problem = check(strategy, feature, json.loads((out / "record.json").read_text()), all_samples)
    counts = read_counts(out)
    if problem is None and reference is not None and counts is not None:
        problem = count_differences(strategy, feature, counts, reference)
    if problem and "training_step is not called" in proc.stderr:
        return "warned", "the pipeline does not call training_step (warned: log in on_pipeline_step)"
    if problem:
        return "WRONG", problem
    difference = weight_difference(read_weights(out), reference_weights)
    if difference is None:
        return "ok", ""
    tolerance = TOLERANCE.get(feature, 1e-5)
    if strategy in VALUES_EXACT and difference > tolerance:
        return "WRONG", f"weights differ from {REFERENCE.get(strategy, 'ddp')}'s by {difference:.2g}"
    return ("ok", "") if difference <= tolerance else (f"ok (Δ {difference:.0e})", f"weights {difference:.2g} from DDP's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", nargs="+", default=STRATEGIES, choices=STRATEGIES)
    parser.add_argument("--features", nargs="+", default=list(FEATURES), choices=list(FEATURES))
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results"))
    parser.add_argument("--namespace", choices=("pytorch_lightning", "lightning"), default="pytorch_lightning",
                        help="the Lightning package every case imports (lightning: `import lightning`, lightning_hybrid.lightning)")
    parser.add_argument("--case", nargs=2, metavar=("STRATEGY", "FEATURE"), help=argparse.SUPPRESS)
    parser.add_argument("--case-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        run_case(*args.case, args.case_dir, args.namespace)
        return
    import tempfile

    results: dict[str, dict[str, tuple[str, str]]] = {}
    references = sorted({REFERENCE.get(s, "ddp") for s in args.strategies if s not in ("partitioned_inference",)})
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "MASTER_PORT", "WORLD_SIZE")}

        def run(strategy: str, feature: str) -> tuple[Path, subprocess.CompletedProcess | None]:
            case_dir = Path(tmp) / f"{strategy}-{feature}"
            case_dir.mkdir(exist_ok=True)
            try:
                return case_dir, subprocess.run([sys.executable, __file__, "--case", strategy, feature, "--case-dir",
                                                 str(case_dir), "--namespace", args.namespace],
                                                capture_output=True, text=True, timeout=300, env=env)
            except subprocess.TimeoutExpired:
                return case_dir, None

        for feature in args.features:
            counts, weights = {}, {}
            for reference in references:
                if reference not in args.strategies:  # ddp_per_epoch, single: only as references
                    case_dir = run(reference, feature)[0]
                    counts[reference], weights[reference] = read_counts(case_dir), read_weights(case_dir)
            for strategy in args.strategies:
                if strategy == "partitioned_inference" and feature != "validate_test_predict":
                    continue
                started = time.perf_counter()
                case_dir, proc = run(strategy, feature)
                if strategy in references:
                    counts[strategy], weights[strategy] = read_counts(case_dir), read_weights(case_dir)
                reference = None if strategy == "ddp" else counts.get(REFERENCE.get(strategy, "ddp"))
                outcome = ("failed", "timed out after 300 s") if proc is None else classify(
                    strategy, feature, case_dir, proc, None if strategy == "partitioned_inference" else reference,
                    None if strategy == "ddp" else weights.get(REFERENCE.get(strategy, "ddp")))
                results.setdefault(feature, {})[strategy] = outcome
                print(f"{strategy:>22} {feature:<28} {outcome[0]:<8} {time.perf_counter() - started:5.1f} s  {outcome[1]}",
                      flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "feature_matrix" if args.namespace == "pytorch_lightning" else "feature_matrix_lightning"
    (args.out / f"{name}.json").write_text(json.dumps(results, indent=1))
    lines = ["| feature | " + " | ".join(args.strategies) + " |", "|---" * (len(args.strategies) + 1) + "|"]
    for feature in args.features:
        cells = [results.get(feature, {}).get(s, ("n/a", ""))[0] for s in args.strategies]
        lines.append(f"| {feature} | " + " | ".join(cells) + " |")
    notes = [f"- {s} x {f}: {o[0]}: {o[1]}" for f, row in results.items() for s, o in row.items() if o[0] != "ok" and o[1]]
    (args.out / f"{name}.md").write_text("\n".join(lines + ["", *notes]) + "\n")
    print("\n".join(lines + ["", *notes]))


if __name__ == "__main__":
    main()
