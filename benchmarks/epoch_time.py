"""Time per training epoch: contenders side by side in one run, through the real CLI.

Each contender is a set of `lightning-hybrid` overrides; all share the same model, data and
seed. The script runs them one after another (never concurrently, so they do not share the
cores), reads the per-epoch times the EpochTimer callback logged, and prints a markdown table
with each contender's ratio to the first.

    python benchmarks/epoch_time.py --data-root ../shared/data/mnist --epochs 2
    python benchmarks/epoch_time.py --contender single: --contender ddp2:strategy=ddp,trainer.devices=2

3D-ResAttNet-18 (33.6 M parameters) on 2 CPU workers, SSP against DDP without stragglers (32^3 synthetic
volumes, batch 2; list values in brackets may hold commas):

    python benchmarks/epoch_time.py --data adni_phantoms --model resattnet3d_18 --epochs 2 \
        --extra "data.view.image_shape=[32,32,32],data.volume_shape=[32,32,32],data.batch_size=2,data.augment.where=null" \
        --contender ddp:strategy=ddp,trainer.devices=2 --contender ssp:strategy=ssp_delay,trainer.devices=2

Writes results to benchmarks/results/epoch_time.{csv,md} (or --out).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_CONTENDERS = ["single:", "ddp2:strategy=ddp,trainer.devices=2"]


def split_overrides(text: str) -> list[str]:
    """Comma-separated Hydra overrides, where a value in brackets may hold commas of its own.

    >>> split_overrides("a=1,b=[2,3],c=x")
    ['a=1', 'b=[2,3]', 'c=x']
    """
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p for p in parts if p]


def parse_contender(text: str) -> tuple[str, list[str]]:
    name, _, overrides = text.partition(":")
    return name, split_overrides(overrides)


def epoch_times(run_dir: Path) -> list[float]:
    (metrics_csv,) = run_dir.glob("csv/*/metrics.csv")
    with open(metrics_csv) as f:
        return [float(row["time/epoch_s"]) for row in csv.DictReader(f) if row.get("time/epoch_s")]


def run_contender(name: str, overrides: list[str], common: list[str], workdir: Path) -> dict:
    run_dir = workdir / name
    cmd = [sys.executable, "-m", "lightning_hybrid.cli", *common, *overrides, f"hydra.run.dir={run_dir}"]
    print(f"[{name}] {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    times = epoch_times(run_dir)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {
        "contender": name,
        "overrides": " ".join(overrides),
        "epochs": len(times),
        "epoch_s_mean": statistics.fmean(times),
        "epoch_s_min": min(times),
        "wall_s": wall,
        "test_acc": metrics.get("test/acc", float("nan")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default=None, help="MNIST folder; without it, synthetic data")
    parser.add_argument("--data", default=None, help="a data config (e.g. adni_phantoms) instead of MNIST")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--contender", action="append", help="NAME:override,override,... (repeatable)")
    parser.add_argument("--extra", default="", help="comma-separated overrides for every contender")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()

    data = [f"data={args.data}"] if args.data else [f"data.root={args.data_root}"] if args.data_root else ["data=synthetic"]
    common = [
        *data, f"model={args.model}", f"trainer.max_epochs={args.epochs}", "trainer.enable_progress_bar=false",
        "trainer.accelerator=cpu", "test=true", *split_overrides(args.extra),
    ]
    workdir = Path(tempfile.mkdtemp(prefix="lh_epoch_time_"))
    try:
        rows = [run_contender(*parse_contender(c), common, workdir) for c in (args.contender or DEFAULT_CONTENDERS)]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    base = rows[0]["epoch_s_mean"]
    for row in rows:
        row["ratio_to_first"] = row["epoch_s_mean"] / base

    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "epoch_time.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        f"Time per training epoch ({args.model}, {args.data or ('MNIST' if args.data_root else 'synthetic')}, {args.epochs} epochs, "
        f"{' '.join(common)})",
        "",
        "| contender | overrides | s/epoch (mean) | s/epoch (min) | ratio to " + rows[0]["contender"] + " | samples/s "
        "against " + rows[0]["contender"] + " | test acc |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['contender']} | `{r['overrides']}` | {r['epoch_s_mean']:.2f} | {r['epoch_s_min']:.2f} | "
            f"{r['ratio_to_first']:.2f} | {1 / r['ratio_to_first']:.2f}x | {r['test_acc']:.4f} |"
        )
    table = "\n".join(lines)
    (args.out / "epoch_time.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
