"""Partitioned inference latency (MoDNN, paper 001): BODP biased by ability vs an even split, side by side.

Each contender runs `trainer.predict` with `PartitionedInferenceStrategy` in its own set of
processes (one thread each), rank 0 simulated `--slowdown` times slower (`sim.slowdown`), on the
same model and inputs; the latency of one batch is timed on rank 0 (median over the batches after
the first, which plans). `single` is the model on one process at full speed (no partition).

    python benchmarks/partitioned_inference.py                       # VGG-16, 224x224, abilities [1, 2]
    python benchmarks/partitioned_inference.py --width 0.5 --batches 6

Writes benchmarks/results/partitioned_inference.{json,md} (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve()


def build_model(width: float, size: int):
    from lightning_hybrid.models import VGG16

    torch.manual_seed(0)
    return VGG16(num_classes=1000, input_size=size, width=width).eval()


def run_contender(args: argparse.Namespace) -> None:
    """One contender, as rank ``LOCAL_RANK`` (Lightning reruns this command for the other ranks)."""
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_hybrid import ClassifierModule, PartitionedInferenceStrategy
    from lightning_hybrid.callbacks import HeterogeneitySimulator

    torch.set_num_threads(1)
    net = build_model(args.width, args.size)
    inputs = torch.randn(args.batches, 3, args.size, args.size, generator=torch.Generator().manual_seed(1))
    if args.devices == 1:  # the whole model on one process at full speed
        times = []
        with torch.no_grad():
            for x in inputs.split(1):
                start = time.perf_counter()
                net(x)
                times.append(time.perf_counter() - start)
        Path(args.result).write_text(json.dumps({"latency_s": statistics.median(times[1:]), "bytes": 0}))
        return

    class Timer(pl.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            self.start = time.perf_counter()

        def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            self.times.append(time.perf_counter() - self.start)

    abilities = None if args.abilities == "probe" else [float(a) for a in args.abilities.split(",")]
    strategy = PartitionedInferenceStrategy(abilities=abilities, conv_partition=args.conv, fc_partition="rows")
    timer = Timer()
    slowdown = [args.slowdown] + [1.0] * (args.devices - 1)
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, strategy=strategy, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[timer, HeterogeneitySimulator(slowdown=slowdown)])
    module = ClassifierModule(net, optimizer=torch.optim.SGD)
    trainer.predict(module, dataloaders=DataLoader(TensorDataset(inputs), batch_size=1), return_predictions=False)
    if trainer.is_global_zero:
        Path(args.result).write_text(json.dumps({
            "latency_s": statistics.median(timer.times[1:]),
            "bytes": sum(t.total_bytes for t in strategy.traffic) / args.batches,
            "abilities": list(strategy.plan.spatial.abilities),
        }))
    torch.distributed.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=float, default=1.0, help="VGG-16 channel multiplier")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batches", type=int, default=5, help="single-image batches per contender")
    parser.add_argument("--slowdown", type=float, default=2.0, help="rank 0 is this many times slower")
    parser.add_argument("--out", type=Path, default=HERE.parent / "results")
    parser.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--devices", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--abilities", default="1,2", help=argparse.SUPPRESS)
    parser.add_argument("--conv", default="bodp", help=argparse.SUPPRESS)
    parser.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run_contender(args)
        return

    fast = f"1,{args.slowdown:g}"
    contenders = [
        ("single process (full speed, no partition)", 1, "1", "bodp"),
        (f"BODP biased, abilities [{fast}]", 2, fast, "bodp"),
        ("BODP biased, abilities probed", 2, "probe", "bodp"),
        ("even split, abilities [1,1]", 2, "1,1", "bodp"),
    ]
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK")}
    for name, devices, abilities, conv in contenders:
        result = args.out / "partitioned_inference_contender.json"
        cmd = [sys.executable, str(HERE), "--run", "--devices", str(devices), "--abilities", abilities, "--conv", conv,
               "--width", str(args.width), "--size", str(args.size), "--batches", str(args.batches),
               "--slowdown", str(args.slowdown), "--result", str(result)]
        print(f"[{name}]", file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        rows.append({"contender": name, **json.loads(result.read_text())})
        result.unlink()
    even = next(r for r in rows if r["contender"].startswith("even"))["latency_s"]
    lines = [f"VGG-16 (width {args.width:g}, {args.size}x{args.size}), one image per batch, 2 processes of 1 thread, "
             f"rank 0 simulated {args.slowdown:g}x slower; median over {args.batches - 1} batches", "",
             "| contender | latency ms | speed-up vs even split | bytes per image |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['contender']} | {1e3 * r['latency_s']:.0f} | {even / r['latency_s']:.2f}x | {r['bytes']:,.0f} |")
    table = "\n".join(lines)
    (args.out / "partitioned_inference.json").write_text(json.dumps(rows, indent=1))
    (args.out / "partitioned_inference.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
