"""Pipeline throughput of placement methods on simulated heterogeneous CPU ranks, side by side.

    python benchmarks/hybrid_placement.py --methods gabra exact uniform time --speeds 1 2

Each method trains 3D-ResAttNet (depth 18, small input) with HybridParallelStrategy on
``len(speeds)`` CPU processes; rank ``i`` computes ``max(speeds) / speeds[i]`` times slower
(``sim.slowdown``: its stage's forward and backward are stretched), and the placement methods are
told the speeds. Samples per second are measured over the training steps after ``--warmup``, averaged
over ``--repeats`` interleaved rounds; the table gives each method's ratio to ``uniform`` and to ``exact``, the predicted bottleneck and the
solver's time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from lightning_hybrid import ClassifierModule, HybridParallelStrategy
from lightning_hybrid.models import ResAttNet3D
from lightning_hybrid.callbacks import HeterogeneitySimulator


class StepClock(pl.Callback):
    def __init__(self, warmup: int) -> None:
        self.warmup, self.start, self.samples = warmup, None, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.warmup:
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx >= self.warmup:
            self.samples += len(batch[0])
            self.end = time.perf_counter()


def worker(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    n = args.batch * (args.steps + args.warmup)
    data = TensorDataset(torch.randn(n, 1, *args.shape), torch.randint(0, 2, (n,)))
    speeds = [float(s) for s in args.speeds]
    slowdown = [max(speeds) / s for s in speeds]
    strategy = HybridParallelStrategy(
        pipeline_stages=len(speeds), placement=args.method, micro_batches=args.micro, devices=speeds,
        schedule=args.schedule, seed=0,
    )
    clock = StepClock(args.warmup)
    trainer = pl.Trainer(
        accelerator="cpu", devices=len(speeds), strategy=strategy, max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[clock, HeterogeneitySimulator(slowdown=slowdown)], num_sanity_val_steps=0,
    )
    net = ResAttNet3D(depth=18, base_channels=args.base_channels)
    trainer.fit(ClassifierModule(net), DataLoader(data, batch_size=args.batch))
    if trainer.is_global_zero:
        p = strategy.placement
        result = {
            "method": args.method, "samples_per_s": clock.samples / (clock.end - clock.start),
            "predicted_bottleneck": p.bottleneck, "solver_s": p.seconds,
            "stages": [f"rank{s.device}:{s.start}-{s.stop}" for s in p.stages],
        }
        Path(args.result).write_text(json.dumps(result))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=["gabra", "exact", "uniform", "time"])
    parser.add_argument("--speeds", nargs="+", default=["1", "2"])
    parser.add_argument("--shape", type=int, nargs=3, default=(32, 32, 32))
    parser.add_argument("--base-channels", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--schedule", default="1F1B")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="rounds over the methods (interleaved); mean reported")
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.method:
        return worker(args)
    runs: dict[str, list[dict]] = {m: [] for m in args.methods}
    for round_, method in [(r, m) for r in range(args.repeats) for m in args.methods]:
        out = Path(f"/tmp/hybrid_placement_{os.getpid()}_{method}.json")
        cmd = [sys.executable, __file__, "--method", method, "--result", str(out), "--speeds", *args.speeds,
               "--shape", *map(str, args.shape), "--base-channels", str(args.base_channels), "--batch", str(args.batch),
               "--micro", str(args.micro), "--schedule", args.schedule, "--steps", str(args.steps),
               "--warmup", str(args.warmup)]
        env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "MASTER_PORT", "WORLD_SIZE")}
        subprocess.run(cmd, check=True, env=env, capture_output=True)
        runs[method].append(json.loads(out.read_text()))
        print(f"round {round_}: {method}: {runs[method][-1]['samples_per_s']:.2f} samples/s", flush=True)
    rows = []
    for method, results in runs.items():
        rates = [r["samples_per_s"] for r in results]
        rows.append({**results[0], "samples_per_s": sum(rates) / len(rates), "min": min(rates), "max": max(rates)})
    by = {r["method"]: r for r in rows}
    print(f"\nResAttNet-18 (base {args.base_channels}), input 1x{'x'.join(map(str, args.shape))}, batch {args.batch}, "
          f"{args.micro} micro-batches, {args.schedule}, speeds {args.speeds}\n")
    print(f"samples/s: mean of {args.repeats} runs (min-max); predicted bottleneck in FLOP / relative speed\n")
    print("| method | stages | samples/s | vs uniform | vs exact | predicted bottleneck | solver time |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        vs_uniform = f"{r['samples_per_s'] / by['uniform']['samples_per_s']:.2f}x" if "uniform" in by else ""
        vs_exact = f"{r['samples_per_s'] / by['exact']['samples_per_s']:.2f}x" if "exact" in by else ""
        print(f"| {r['method']} | {' '.join(r['stages'])} | {r['samples_per_s']:.2f} ({r['min']:.2f}-{r['max']:.2f}) | {vs_uniform} | {vs_exact} | "
              f"{r['predicted_bottleneck']:.3g} | {r['solver_s'] * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
