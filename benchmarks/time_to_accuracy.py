"""Time to a target accuracy: strategies side by side, same model, data, seed and heterogeneity.

Each contender is a set of `lightning-hybrid` overrides run through the real CLI, one after
another (never concurrently). Every run validates on the test set after each epoch
(`data.val_set=test`) and stops early once the target is reached; epochs are shortened to
`--batches-per-epoch` batches per worker so that accuracy is measured often; the wall-clock time of each
validation comes from the EpochTimer callback (`time/elapsed_s`). The first contender is the
reference for the ratios (DDP by default).

    python benchmarks/time_to_accuracy.py --data-root ../shared/data/mnist --target 0.98 \\
        --scenario "persistent:sim.slowdown=[1.0,4.0]" --scenario "transient:sim=stragglers"

Writes, per scenario, to --out (benchmarks/results/ by default): time_to_accuracy_<scenario>.csv
(every epoch of every run), .png (accuracy against wall-clock time) and .md (the table).
"""

from __future__ import annotations

import argparse
import csv
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Learning rates follow the linear scaling rule: DDP's update averages 2 x 64 = 128 samples (lr
# 0.05, the main job's), an SSP update is one worker's 64 samples (lr 0.025). ddp_lr025 is the
# control that DDP does not gain from the smaller rate.
SSP = "strategy=ssp,optimizer.lr=0.025"
DEFAULT_CONTENDERS = [
    "ddp:strategy=ddp",
    "ddp_lr025:strategy=ddp,optimizer.lr=0.025",
    f"ssp_delay_s1:{SSP},strategy.sync=delay,strategy.staleness=1",
    f"ssp_delay_s2:{SSP},strategy.sync=delay,strategy.staleness=2",
    f"ssp_delay_s3:{SSP},strategy.sync=delay,strategy.staleness=3",
    f"ssp_bounded_s1:{SSP},strategy.sync=bounded,strategy.staleness=1",
    f"ssp_bounded_s2:{SSP},strategy.sync=bounded,strategy.staleness=2",
    f"ssp_bounded_s3:{SSP},strategy.sync=bounded,strategy.staleness=3",
    f"ssp_async:{SSP},strategy.staleness=inf",
    "balanced:strategy=balanced",
]


def split_overrides(text: str) -> list[str]:
    """Comma-separated overrides; commas inside [...] belong to a list value."""
    out, depth, current = [], 0, ""
    for char in text:
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            out.append(current)
            current = ""
        else:
            current += char
    return [o for o in out + [current] if o]


def named(text: str) -> tuple[str, list[str]]:
    name, _, overrides = text.partition(":")
    return name, split_overrides(overrides)


def read_curve(run_dir: Path) -> list[dict[str, float]]:
    """(epoch, elapsed_s, val_acc) rows from the run's CSV log."""
    (metrics_csv,) = run_dir.glob("csv/*/metrics.csv")
    by_epoch: dict[int, dict[str, float]] = {}
    with open(metrics_csv) as f:
        for row in csv.DictReader(f):
            epoch = int(row["epoch"]) if row.get("epoch") else None
            if epoch is None:
                continue
            entry = by_epoch.setdefault(epoch, {"epoch": epoch})
            for key, name in (("time/elapsed_s", "elapsed_s"), ("val/acc", "val_acc")):
                if row.get(key):
                    entry[name] = float(row[key])
    return [e for _, e in sorted(by_epoch.items()) if "elapsed_s" in e and "val_acc" in e]


def time_to(curve: list[dict[str, float]], target: float) -> float:
    return next((e["elapsed_s"] for e in curve if e["val_acc"] >= target), math.inf)


def seconds_per_epoch(curve: list[dict[str, float]]) -> float:
    """Mean wall-clock seconds per epoch (training and the evaluation after it)."""
    return curve[-1]["elapsed_s"] / len(curve) if curve else float("nan")


def run(name: str, overrides: list[str], common: list[str], workdir: Path) -> dict:
    run_dir = workdir / name
    cmd = [sys.executable, "-m", "lightning_hybrid.cli", *common, *overrides, f"hydra.run.dir={run_dir}"]
    print(f"[{name}] {' '.join(common + overrides)}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        print(proc.stderr[-4000:], file=sys.stderr)
        raise SystemExit(f"[{name}] failed with exit code {proc.returncode}")
    return {"name": name, "overrides": " ".join(overrides), "curve": read_curve(run_dir), "wall_s": wall}


def write_outputs(scenario: str, results: list[dict], target: float, out: Path, header: str) -> str:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"time_to_accuracy_{scenario}.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["scenario", "contender", "epoch", "elapsed_s", "val_acc"])
        for r in results:
            for e in r["curve"]:
                writer.writerow([scenario, r["name"], e["epoch"], f"{e['elapsed_s']:.3f}", f"{e['val_acc']:.4f}"])
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in results:
            ax.plot([e["elapsed_s"] for e in r["curve"]], [e["val_acc"] for e in r["curve"]], marker="o", label=r["name"])
        ax.axhline(target, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("wall-clock seconds since training started")
        ax.set_ylabel("test accuracy")
        ax.set_title(f"time to accuracy: {scenario}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / f"time_to_accuracy_{scenario}.png", dpi=110)
        plt.close(fig)
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
    reference = time_to(results[0]["curve"], target)
    ref_epoch_s = seconds_per_epoch(results[0]["curve"])
    ref_final = results[0]["curve"][-1]["val_acc"] if results[0]["curve"] else float("nan")
    name0 = results[0]["name"]
    lines = [
        f"### {scenario}",
        "",
        header,
        "",
        f"| contender | time to {target:.0%} (s) | speed-up vs {name0} | epochs to target | s/epoch | throughput vs {name0} "
        f"| final acc | gap to {name0} (points) | epochs run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        t = time_to(r["curve"], target)
        epochs = next((e["epoch"] + 1 for e in r["curve"] if e["val_acc"] >= target), None)
        final = r["curve"][-1]["val_acc"] if r["curve"] else float("nan")
        reached = math.isfinite(t) and math.isfinite(reference)
        t_text = f"{t:.1f}" if math.isfinite(t) else "not reached"
        speedup = f"{reference / t:.2f}x" if reached else "-"
        epoch_s = seconds_per_epoch(r["curve"])
        lines.append(
            f"| {r['name']} | {t_text} | {speedup} | {epochs or '-'} | {epoch_s:.2f} | {ref_epoch_s / epoch_s:.2f}x "
            f"| {final:.4f} | {100 * (final - ref_final):+.2f} | {len(r['curve'])} |"
        )
    table = "\n".join(lines) + "\n"
    (out / f"time_to_accuracy_{scenario}.md").write_text(table)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default=None, help="MNIST folder; without it, synthetic data")
    parser.add_argument("--target", type=float, default=0.98)
    parser.add_argument("--max-epochs", type=int, default=16)
    parser.add_argument(
        "--batches-per-epoch", type=int, default=100,
        help="limit_train_batches per worker: short epochs, so accuracy is measured often (SSP validates at epoch "
        "ends); 0 for whole epochs",
    )
    parser.add_argument(
        "--no-early-stop", action="store_true",
        help="train every contender for --max-epochs (to compare accuracy at equal epochs)",
    )
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--contender", action="append", help="NAME:override,override (repeatable); first = reference")
    parser.add_argument("--scenario", action="append", help="NAME:sim overrides (repeatable)")
    parser.add_argument("--extra", default="", help="comma-separated overrides for every run")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()

    data = [f"data.root={args.data_root}", "data.val_set=test"] if args.data_root else ["data=synthetic"]
    common = [
        *data, "model=lenet5", "data.batch_size=64", f"trainer.max_epochs={args.max_epochs}",
        f"trainer.devices={args.devices}", "trainer.accelerator=cpu", "trainer.enable_progress_bar=false",
        "trainer.num_sanity_val_steps=0", "test=false", "allow_cpu_oversubscription=true",
        *(["callbacks=[epoch_timer]"] if args.no_early_stop else [
            "callbacks=[epoch_timer,early_stopping]", "callbacks.early_stopping.patience=100",
            f"callbacks.early_stopping.stopping_threshold={args.target}",
        ]),
        *([f"trainer.limit_train_batches={args.batches_per_epoch}"] if args.batches_per_epoch else []),
        *split_overrides(args.extra),
    ]
    scenarios = [named(s) for s in (args.scenario or ["persistent:sim.slowdown=[1.0,4.0]", "transient:sim=stragglers"])]
    contenders = [named(c) for c in (args.contender or DEFAULT_CONTENDERS)]
    header = (
        f"LeNet-5, {'MNIST' if args.data_root else 'synthetic data'}, batch 64 per worker, {args.devices} workers, seed 0, "
        f"SGD momentum 0.9, an 'epoch' = {args.batches_per_epoch} batches per worker, test accuracy after each"
    )
    workdir = Path(tempfile.mkdtemp(prefix="lh_tta_"))
    try:
        for scenario, sim in scenarios:
            # a contender's own overrides come last, so that they can take something out of the scenario
            results = [run(f"{scenario}_{name}", sim + overrides, common, workdir) for name, overrides in contenders]
            for r, (name, _) in zip(results, contenders):
                r["name"] = name
            print(write_outputs(scenario, results, args.target, args.out, f"{header}; sim: `{' '.join(sim)}`"), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
