"""Time to a target accuracy: strategies side by side, same model, data, seeds and heterogeneity.

Each contender is a set of `lightning-hybrid` overrides run through the real CLI, one run after
another (never concurrently), once per seed. Every run validates on the test set after each epoch
(`data.val_set=test`) and stops early once the target is reached; epochs are shortened to
`--batches-per-epoch` batches per worker so that accuracy is measured often; the wall-clock time of
each validation comes from the EpochTimer callback: `--clock training` (the default) counts the
training's wall-clock time without the validation loops (`time/training_s`: measuring accuracy after
every short epoch is the benchmark's cost, not the strategy's), `--clock wall` everything since
training started (`time/elapsed_s`). The first contender is the
reference for the ratios (DDP by default). A claim of "faster" is made on medians over the seeds,
with the range beside them.

    python benchmarks/time_to_accuracy.py --data-root ../shared/data/mnist --target 0.98 --seeds 0 1 2 \\
        --scenario "none:sim=default" --scenario "persistent:sim.slowdown=[1.0,4.0]" \\
        --scenario "transient:sim=stragglers"

Writes, per scenario, to --out (benchmarks/results/ by default): time_to_accuracy_<scenario>.csv
(every epoch of every run), .png (accuracy against wall-clock time, seed 0) and .md (the tables: time to
each target, and the mean test accuracy after each epoch, which says how much an epoch of each
contender is worth with less noise than a crossing time; pass --no-early-stop and several seeds for it).
"""

from __future__ import annotations

import argparse
import csv
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Every contender runs the optimizer config's learning rate (0.05, momentum 0.9; the recipe passes
# `--extra optimizer.lr=0.02`, where DDP's own crossing of 98 % is less erratic): under DDP it is
# the rate of one step on the 2 x 64 samples of the global batch; SSPStrategy's default update rule
# averages one push per worker into each step, which gives it the same meaning. `ssp_per_push_s3` is
# the earlier rule (every push a step, at lr 0.025: half the default 0.05) for comparison.
DEFAULT_CONTENDERS = [
    "ddp:strategy=ddp",
    "balanced:strategy=balanced",
    "ssp_delay_s3:strategy=ssp,strategy.sync=delay,strategy.staleness=3",
    "ssp_bounded_s3:strategy=ssp,strategy.sync=bounded,strategy.staleness=3",
    "ssp_async:strategy=ssp,strategy.staleness=inf",
    "ssp_per_push_s3:strategy=ssp,strategy.staleness=3,strategy.pushes_per_update=1,strategy.staleness_lr=false,"
    "strategy.momentum_correction=false,optimizer.lr=0.025",
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


def read_curve(run_dir: Path, clock: str = "training") -> list[dict[str, float]]:
    """(epoch, elapsed_s, val_acc) rows from the run's CSV log; elapsed_s on the chosen clock."""
    (metrics_csv,) = run_dir.glob("csv/*/metrics.csv")
    by_epoch: dict[int, dict[str, float]] = {}
    with open(metrics_csv) as f:
        for row in csv.DictReader(f):
            epoch = int(row["epoch"]) if row.get("epoch") else None
            if epoch is None:
                continue
            entry = by_epoch.setdefault(epoch, {"epoch": epoch})
            for key, name in ((f"time/{'training' if clock == 'training' else 'elapsed'}_s", "elapsed_s"), ("val/acc", "val_acc")):
                if row.get(key):
                    entry[name] = float(row[key])
    return [e for _, e in sorted(by_epoch.items()) if "elapsed_s" in e and "val_acc" in e]


def time_to(curve: list[dict[str, float]], target: float) -> float:
    return next((e["elapsed_s"] for e in curve if e["val_acc"] >= target), math.inf)


def seconds_per_epoch(curve: list[dict[str, float]]) -> float:
    """Mean seconds per epoch on the chosen clock."""
    return curve[-1]["elapsed_s"] / len(curve) if curve else float("nan")


def run(name: str, overrides: list[str], common: list[str], workdir: Path, clock: str) -> list[dict[str, float]]:
    run_dir = workdir / name
    cmd = [sys.executable, "-m", "lightning_hybrid.cli", *common, *overrides, f"hydra.run.dir={run_dir}"]
    print(f"[{name}] {' '.join(common + overrides)}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        print(proc.stderr[-4000:], file=sys.stderr)
        raise SystemExit(f"[{name}] failed with exit code {proc.returncode}")
    return read_curve(run_dir, clock)


def median_and_range(values: list[float], fmt: str = "{:.1f}") -> str:
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) <= len(values) / 2:  # the median itself is "not reached"
        return f"not reached ({len(finite)}/{len(values)})"
    text = fmt.format(statistics.median(values))
    return text + (f" [{fmt.format(min(values))}-{fmt.format(max(values))}]" if len(values) > 1 else "") + (
        f" ({len(values) - len(finite)} not reached)" if len(finite) < len(values) else "")


def summarize(curves: list[list[dict[str, float]]], target: float) -> dict[str, list[float]]:
    return {
        "time": [time_to(c, target) for c in curves],
        "epochs": [next((e["epoch"] + 1 for e in c if e["val_acc"] >= target), math.inf) for c in curves],
        "final": [c[-1]["val_acc"] if c else float("nan") for c in curves],
        "epoch_s": [seconds_per_epoch(c) for c in curves],
    }


def write_outputs(scenario: str, results: dict[str, list[list[dict[str, float]]]], seeds: list[int],
                  targets: list[float], out: Path, header: str) -> str:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"time_to_accuracy_{scenario}.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["scenario", "contender", "seed", "epoch", "elapsed_s", "val_acc"])
        for name, curves in results.items():
            for seed, curve in zip(seeds, curves):
                for e in curve:
                    writer.writerow([scenario, name, seed, e["epoch"], f"{e['elapsed_s']:.3f}", f"{e['val_acc']:.4f}"])
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, curves in results.items():
            ax.plot([e["elapsed_s"] for e in curves[0]], [e["val_acc"] for e in curves[0]], marker="o", label=name)
        for target in targets:
            ax.axhline(target, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("seconds since training started" + (" (validation excluded)" if "training time" in header else ""))
        ax.set_ylabel("test accuracy")
        ax.set_title(f"time to accuracy: {scenario} (seed {seeds[0]})")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / f"time_to_accuracy_{scenario}.png", dpi=110)
        plt.close(fig)
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
    name0 = next(iter(results))
    lines = [
        f"### {scenario}",
        "",
        header,
        "",
        f"Median over seeds {', '.join(map(str, seeds))} [range]; speed-up = {name0}'s median time / the contender's.",
    ]
    for target in targets:
        lines += table_lines(results, target, name0)
    lines += epoch_accuracy_lines(results)
    table = "\n".join(lines) + "\n"
    (out / f"time_to_accuracy_{scenario}.md").write_text(table)
    return table


def table_lines(results: dict[str, list[list[dict[str, float]]]], target: float, name0: str) -> list[str]:
    stats = {name: summarize(curves, target) for name, curves in results.items()}
    ref = stats[name0]
    ref_time = statistics.median(ref["time"])
    ref_final = statistics.median(ref["final"])
    ref_epoch_s = statistics.median(ref["epoch_s"])
    lines = [
        "",
        f"| contender | time to {target:.0%} (s) | speed-up vs {name0} | epochs to target | s/epoch | throughput vs {name0} "
        f"| final acc | gap to {name0} (points) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, st in stats.items():
        median_time = statistics.median(st["time"])
        reached = math.isfinite(median_time) and math.isfinite(ref_time)
        epoch_s = statistics.median(st["epoch_s"])
        lines.append(
            f"| {name} | {median_and_range(st['time'])} | {f'{ref_time / median_time:.2f}x' if reached else '-'} "
            f"| {median_and_range(st['epochs'], '{:.0f}')} | {epoch_s:.2f} | {ref_epoch_s / epoch_s:.2f}x "
            f"| {median_and_range(st['final'], '{:.4f}')} | {100 * (statistics.median(st['final']) - ref_final):+.2f} |"
        )
    return lines


def epoch_accuracy_lines(results: dict[str, list[list[dict[str, float]]]]) -> list[str]:
    """Test accuracy after each epoch, mean over the seeds +- its standard error: how much an epoch is
    worth, without the noise of where a fluctuating curve first crosses a target. Only the epochs
    every run reached (with early stopping the runs end at the target: use --no-early-stop)."""
    curves = [c for runs in results.values() for c in runs]
    epochs = min((len(c) for c in curves), default=0)
    if epochs == 0:
        return []
    lines = [
        "",
        f"Test accuracy after each epoch, mean over the seeds +- standard error (epochs 1-{epochs}, which every run reached):",
        "",
        "| contender | " + " | ".join(f"epoch {k + 1}" for k in range(epochs)) + " |",
        "|---|" + "---|" * epochs,
    ]
    for name, runs in results.items():
        cells = []
        for k in range(epochs):
            values = [c[k]["val_acc"] for c in runs]
            error = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
            cells.append(f"{statistics.mean(values):.4f} +- {error:.4f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default=None, help="MNIST folder; without it, synthetic data")
    parser.add_argument("--target", type=float, nargs="+", default=[0.98],
                        help="target accuracies (one table each; early stopping at the highest)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run per seed (default 0 1 2)")
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
    parser.add_argument(
        "--clock", choices=["training", "wall"], default="training",
        help="time axis: training time without the validation loops (default), or all wall-clock time",
    )
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
            f"callbacks.early_stopping.stopping_threshold={max(args.target)}",
        ]),
        *([f"trainer.limit_train_batches={args.batches_per_epoch}"] if args.batches_per_epoch else []),
        *split_overrides(args.extra),
    ]
    scenarios = [named(s) for s in (args.scenario or ["persistent:sim.slowdown=[1.0,4.0]", "transient:sim=stragglers"])]
    contenders = [named(c) for c in (args.contender or DEFAULT_CONTENDERS)]
    header = (
        f"LeNet-5, {'MNIST' if args.data_root else 'synthetic data'}, batch 64 per worker, {args.devices} workers, "
        f"an 'epoch' = {args.batches_per_epoch} batches per worker, test accuracy after each; "
        f"clock: {'training time, validation excluded' if args.clock == 'training' else 'wall-clock, validation included'}"
    )
    workdir = Path(tempfile.mkdtemp(prefix="lh_tta_"))
    start = time.perf_counter()
    try:
        for scenario, sim in scenarios:
            results: dict[str, list[list[dict[str, float]]]] = {name: [] for name, _ in contenders}
            for seed in args.seeds:  # seeds in the outer loop: a busy spell disturbs every contender alike
                for name, overrides in contenders:
                    # a contender's own overrides come last, so that they can take something out of the scenario
                    results[name].append(run(f"{scenario}_{name}_s{seed}", [f"seed={seed}", *sim, *overrides], common, workdir, args.clock))
            table = write_outputs(scenario, results, args.seeds, args.target, args.out, f"{header}; sim: `{' '.join(sim)}`")
            print(table, flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"benchmark wall time: {time.perf_counter() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
