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

The straggler grid (`--sources`, `--patterns`): where a rank's time goes, crossed with how it is slow.

* sources: `compute` (the simulator stretches forward/backward), `after_step` (a sleep after the
  optimizer step), `data` (the rank's DataLoader delivers later), `contention` (real CPU contention:
  the straggler rank pinned to a core that CPU-bound competitor processes share, started and stopped
  here around each run, `lightning_hybrid.sim.Competitor`: no strategy can know where the time goes).
* patterns: `none`, `persistent` (the last rank 4x slower; contention: one competitor on its core,
  about 2x), `transient` (every rank 8x slower with probability 0.1 per step; contention: seven
  competitors on each rank's core, running in random 50 ms spells with probability 0.1).

With `--lrs`, each contender first runs a learning-rate sweep without stragglers (same seeds) and
keeps its best rate (the shortest median time to the highest target) for the whole grid; the sweep's
table is printed. With `--batches-per-epoch` short epochs, accuracy is measured often.

    python benchmarks/time_to_accuracy.py --data-root ../shared/data/mnist --model lenet5 --target 0.98 \
        --seeds 0 1 2 --lrs 0.01 0.02 0.05 --sources compute after_step data contention \
        --patterns none persistent transient --contender-set grid

    python benchmarks/time_to_accuracy.py --data-root ../shared/data/mnist --target 0.98 --seeds 0 1 2 \
        --scenario "none:sim=default" --scenario "persistent:sim.slowdown=[1.0,4.0]"   # scenarios by hand

Writes, per scenario, to --out (benchmarks/results/ by default): time_to_accuracy_<scenario>.csv
(every epoch of every run), .png (accuracy against wall-clock time and against epochs, every contender
and seed on one figure, with matplotlib) and .md (the tables: time to each target, and the mean test accuracy after each epoch,
which says how much an epoch of each contender is worth with less noise than a crossing time; pass
--no-early-stop and several seeds for it); the grid's summary (speed-up of every contender in every
scenario) in time_to_accuracy_grid_<model>.md and as bars in .png. `--plot-table FILE.md` redraws such a
summary table kept elsewhere (a recipe's) as bars, without running anything.
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
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # plot_table, beside this script

# Every contender runs the optimizer config's learning rate unless --lrs sweeps it: under DDP it is
# the rate of one step on the 2 x 64 samples of the global batch; SSPStrategy's default update rule
# averages one push per worker into each step, which gives it the same meaning. `ssp_per_push_s3` is
# the earlier rule (every push a step, at half the rate) for comparison.
DEFAULT_CONTENDERS = [
    "ddp:strategy=ddp",
    "balanced:strategy=balanced",
    "ssp_delay_s3:strategy=ssp_delay,strategy.sync=delay,strategy.staleness=3",
    "ssp_bounded_s3:strategy=ssp_bounded,strategy.staleness=3",
    "ssp_async:strategy=ssp_async",
    "ssp_per_push_s3:strategy=ssp_delay,strategy.staleness=3,strategy.pushes_per_update=1,strategy.staleness_lr=false,"
    "strategy.momentum_correction=false,optimizer.lr=0.025",
]
#: The straggler grid's contenders: what a user would pick, each with its defaults.
GRID_CONTENDERS = [
    "ddp:strategy=ddp",
    "balanced:strategy=balanced",
    "ssp:strategy=ssp_delay",
    "ssp_async:strategy=ssp_async",
    "delayed_averaging:strategy=delayed_averaging",
]
CONTENDER_SETS = {"default": DEFAULT_CONTENDERS, "grid": GRID_CONTENDERS}

SOURCES = ("compute", "after_step", "data", "contention")
PATTERNS = ("none", "persistent", "transient")
#: The persistent straggler's slowdown, and the transient stragglers' (with their probability).
PERSISTENT_FACTOR, TRANSIENT_FACTOR, TRANSIENT_PROB = 4.0, 8.0, 0.1
#: Contention: competitors on the straggler's core (persistent: about 2x), on every core in spells (transient: 8x).
PERSISTENT_COMPETITORS, TRANSIENT_COMPETITORS, SPELL_S = 1, 7, 0.05


class Scenario:
    """A named heterogeneity: overrides for the simulator, and for real contention the competitors to
    start around each run (``(cores, processes, duty)`` each)."""

    def __init__(self, name: str, overrides: list[str], competitors: list[tuple[list[int], int, float]] | None = None,
                 slowdown: float = 1.0) -> None:
        self.name, self.overrides, self.competitors, self.slowdown = name, overrides, competitors or [], slowdown

    def contention(self, seed: int) -> ExitStack:
        """A context that runs this scenario's competitors (nothing for a simulated one)."""
        from lightning_hybrid.sim import Competitor

        stack = ExitStack()
        for k, (cores, processes, duty) in enumerate(self.competitors):
            stack.enter_context(Competitor(cores, processes, duty=duty, period_s=SPELL_S, seed=1000 * seed + k))
        return stack


def grid_scenarios(sources: list[str], patterns: list[str], devices: int) -> list[Scenario]:
    """The scenarios of sources x patterns (``none`` once): the last rank is the persistent straggler."""
    scenarios = []
    if "none" in patterns:
        scenarios.append(Scenario("none", ["sim=default"]))
    last = devices - 1
    for source in sources:
        for pattern in patterns:
            if pattern == "none":
                continue
            name = f"{source}_{pattern}"
            if source == "contention":
                if pattern == "persistent":
                    pins = ",".join(["null"] * last + [f"[{last}]"])
                    scenarios.append(Scenario(name, [f"sim.affinity=[{pins}]"], [([last], PERSISTENT_COMPETITORS, 1.0)],
                                              slowdown=PERSISTENT_COMPETITORS + 1.0))
                else:
                    pins = ",".join(f"[{r}]" for r in range(devices))
                    scenarios.append(Scenario(name, [f"sim.affinity=[{pins}]"],
                                              [([r], TRANSIENT_COMPETITORS, TRANSIENT_PROB) for r in range(devices)]))
            elif pattern == "persistent":
                factors = ",".join(["1.0"] * last + [str(PERSISTENT_FACTOR)])
                scenarios.append(Scenario(name, [f"sim.slowdown=[{factors}]", f"sim.where={source}"],
                                          slowdown=PERSISTENT_FACTOR))
            else:
                scenarios.append(Scenario(name, [f"sim.straggle_prob={TRANSIENT_PROB}",
                                                 f"sim.straggle_factor={TRANSIENT_FACTOR}", f"sim.where={source}"]))
    return scenarios


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


def run(name: str, overrides: list[str], common: list[str], workdir: Path, clock: str,
        contention: ExitStack | None = None) -> list[dict[str, float]]:
    """One training run through the CLI (inside ``contention``: competitors running); its curve."""
    run_dir = workdir / name
    cmd = [sys.executable, "-m", "lightning_hybrid.cli", *common, *overrides, f"hydra.run.dir={run_dir}"]
    print(f"[{name}] {' '.join(overrides)}", file=sys.stderr, flush=True)
    with contention or ExitStack():
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

        fig, (by_time, by_epoch) = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
        for i, (name, curves) in enumerate(results.items()):
            colour = f"C{i}"
            for k, curve in enumerate(curves):  # every seed; the first drawn bold and labelled
                style = dict(color=colour, marker="o", markersize=3 if k else 4, linewidth=1.8 if k == 0 else 0.8,
                             alpha=1.0 if k == 0 else 0.45, label=name if k == 0 else None)
                accuracy = [e["val_acc"] for e in curve]
                by_time.plot([e["elapsed_s"] for e in curve], accuracy, **style)
                by_epoch.plot([e["epoch"] + 1 for e in curve], accuracy, **style)
        for ax in (by_time, by_epoch):
            for target in targets:
                ax.axhline(target, color="grey", linestyle="--", linewidth=1)
            ax.set_ylim(max(0.0, min(targets) - 0.06), 1.0)
            ax.grid(alpha=0.3)
        by_time.set_xlabel("seconds since training started" + (" (validation excluded)" if "training time" in header else ""))
        by_epoch.set_xlabel("epoch")
        by_time.set_ylabel("test accuracy")
        fig.suptitle(f"time to accuracy: {scenario} (seeds {', '.join(map(str, seeds))}; seed {seeds[0]} bold)")
        by_epoch.legend(fontsize=8)
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


def read_results(csv_path: Path) -> dict[str, list[list[dict[str, float]]]]:
    """The curves a scenario's CSV file holds: contender -> one curve per seed (in file order)."""
    curves: dict[str, dict[int, list[dict[str, float]]]] = {}
    with open(csv_path) as f:
        for row in csv.DictReader(f):
            curve = curves.setdefault(row["contender"], {}).setdefault(int(row["seed"]), [])
            curve.append({"epoch": int(row["epoch"]), "elapsed_s": float(row["elapsed_s"]), "val_acc": float(row["val_acc"])})
    return {name: list(by_seed.values()) for name, by_seed in curves.items()}


def best_learning_rates(sweep: dict[str, dict[float, list[list[dict[str, float]]]]], target: float) -> dict[str, float]:
    """Each contender's rate with the shortest median time to ``target`` (not reached: infinite; ties:
    the higher median accuracy at the end)."""
    def key(item: tuple[float, list[list[dict[str, float]]]]) -> tuple[float, float]:
        stats = summarize(item[1], target)
        return statistics.median(stats["time"]), -statistics.median(stats["final"])

    return {name: min(by_lr.items(), key=key)[0] for name, by_lr in sweep.items()}


def sweep_lines(sweep: dict[str, dict[float, list[list[dict[str, float]]]]], target: float,
                chosen: dict[str, float]) -> list[str]:
    lrs = sorted({lr for by_lr in sweep.values() for lr in by_lr})
    lines = [
        f"| contender | " + " | ".join(f"lr {lr:g}: time to {target:.0%} (s)" for lr in lrs) + " | chosen |",
        "|---|" + "---|" * (len(lrs) + 1),
    ]
    for name, by_lr in sweep.items():
        cells = [median_and_range(summarize(by_lr[lr], target)["time"]) if lr in by_lr else "-" for lr in lrs]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {chosen[name]:g} |")
    return lines


def grid_lines(stats: dict[str, dict[str, list[float]]], scenarios: list[Scenario], names: list[str],
               target: float) -> list[str]:
    """One row per scenario: each contender's speed-up against the first (median times), and what a
    throughput-balanced synchronous DP could reach at most: ``(f + 1) / 2`` for one rank ``f`` times
    slower, with ``f`` the nominal slowdown and the one measured, the reference's (DDP's) seconds per
    epoch in the scenario over those without stragglers (DDP runs at the slowest rank's pace)."""
    ref = names[0]
    calm = next((stats[s.name][ref] for s in scenarios if s.name == "none"), None)
    lines = [
        f"| scenario | " + " | ".join(f"{n}" for n in names) + " | balanced's limit: nominal, measured (x 0.75) |",
        "|---|" + "---|" * (len(names) + 1),
    ]
    for scenario in scenarios:
        row = stats[scenario.name]
        ref_time = statistics.median(row[ref]["time"])
        cells = []
        for name in names:
            median = statistics.median(row[name]["time"])
            if not math.isfinite(median):
                cells.append("not reached")
            elif name == ref:
                cells.append(f"{median:.1f} s")
            else:
                cells.append(f"{ref_time / median:.2f}x" if math.isfinite(ref_time) else f"{median:.1f} s")
        limit = (scenario.slowdown + 1) / 2 if scenario.slowdown > 1 else 1.0
        measured = "-"
        if calm is not None and scenario.slowdown > 1:
            slowdown = statistics.median(row[ref]["epoch_s"]) / statistics.median(calm["epoch_s"])
            measured = f"{(slowdown + 1) / 2:.2f}x ({0.75 * (slowdown + 1) / 2:.2f}x; f = {slowdown:.2f})"
        lines.append(f"| {scenario.name} | " + " | ".join(cells) + f" | {limit:.2f}x, {measured} |")
    return lines


def plot_grid(speedups: dict[str, dict[str, float]], out: Path, title: str) -> bool:
    """The grid's summary as bars: for each scenario, each contender's speed-up against the reference
    (``speedups[scenario][contender]``; ``nan``: never reached the target, a cross). False when
    matplotlib is missing."""
    from plot_table import grouped_bars

    scenarios = list(speedups)
    names = list(next(iter(speedups.values())))
    series = {name: [speedups[s].get(name, math.nan) for s in scenarios] for name in names}
    try:
        grouped_bars(["\n".join(s.rsplit("_", 1)) for s in scenarios], series, out, title,
                     f"speed-up against {names[0]} (time to target)", baseline=1.0, values_on_bars=False)
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
        return False
    return True


def grid_speedups(stats: dict[str, dict[str, dict[str, list[float]]]], names: list[str]) -> dict[str, dict[str, float]]:
    """Each contender's speed-up against the first in every scenario (median times), ``nan`` if never reached."""
    speedups = {}
    for scenario, row in stats.items():
        ref = statistics.median(row[names[0]]["time"])
        speedups[scenario] = {name: (ref / statistics.median(row[name]["time"])
                                     if math.isfinite(statistics.median(row[name]["time"])) and math.isfinite(ref)
                                     else math.nan) for name in names}
    return speedups


def speedups_from_table(markdown: str) -> dict[str, dict[str, float]]:
    """The speed-ups of a grid summary table as this script prints it (``| scenario | ddp | ... |``,
    the reference's cell in seconds, the others as ``1.23x`` or ``not reached``): how a figure is
    redrawn from a table kept in a recipe."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    names = [name for name in header[1:] if not name.startswith("balanced's limit")]
    speedups: dict[str, dict[str, float]] = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        row = {}
        for name, cell in zip(names, cells[1:]):
            if cell.endswith(" s"):
                row[name] = 1.0
            elif cell.endswith("x"):
                row[name] = float(cell[:-1])
            else:
                row[name] = math.nan
        speedups[cells[0]] = row
    return speedups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default=None, help="MNIST folder; without it, synthetic data")
    parser.add_argument("--model", default="lenet5", help="model config (lenet5, mlp, ...)")
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
    parser.add_argument("--contender-set", choices=sorted(CONTENDER_SETS), default=None,
                        help="a named list of contenders (grid: ddp, balanced, ssp, ssp_async, delayed_averaging)")
    parser.add_argument("--scenario", action="append", help="NAME:sim overrides (repeatable)")
    parser.add_argument("--sources", nargs="+", choices=SOURCES, default=None, help="the straggler grid's sources")
    parser.add_argument("--patterns", nargs="+", choices=PATTERNS, default=list(PATTERNS), help="the grid's patterns")
    parser.add_argument("--lrs", type=float, nargs="+", default=None,
                        help="sweep each contender's learning rate without stragglers first; keep its best")
    parser.add_argument("--sweep-seeds", type=int, nargs="+", default=None, help="the sweep's seeds (default: --seeds)")
    parser.add_argument(
        "--clock", choices=["training", "wall"], default="training",
        help="time axis: training time without the validation loops (default), or all wall-clock time",
    )
    parser.add_argument("--extra", default="", help="comma-separated overrides for every run")
    parser.add_argument("--summarize", action="store_true",
                        help="run nothing: rebuild the grid's summary from the CSV files an earlier run wrote to --out")
    parser.add_argument("--plot-table", type=Path, default=None,
                        help="run nothing: draw the grid summary table in this markdown file (one table) as bars, "
                        "to --out/<its name>.png")
    parser.add_argument("--title", default=None, help="the --plot-table figure's title")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    if args.plot_table:
        png = args.out / f"{args.plot_table.stem}.png"
        if plot_grid(speedups_from_table(args.plot_table.read_text()), png, args.title or args.plot_table.stem):
            print(f"figure: {png}")
        return

    data = [f"data.root={args.data_root}", "data.val_set=test"] if args.data_root else ["data=synthetic"]
    common = [
        *data, f"model={args.model}", "data.batch_size=64", f"trainer.max_epochs={args.max_epochs}",
        f"trainer.devices={args.devices}", "trainer.accelerator=cpu", "trainer.enable_progress_bar=false",
        "trainer.num_sanity_val_steps=0", "test=false", "allow_cpu_oversubscription=true",
        *(["callbacks=[epoch_timer]"] if args.no_early_stop else [
            "callbacks=[epoch_timer,early_stopping]", "callbacks.early_stopping.patience=100",
            f"callbacks.early_stopping.stopping_threshold={max(args.target)}",
        ]),
        *([f"trainer.limit_train_batches={args.batches_per_epoch}"] if args.batches_per_epoch else []),
        *split_overrides(args.extra),
    ]
    if args.sources:
        scenarios = grid_scenarios(args.sources, args.patterns, args.devices)
    else:
        scenarios = [Scenario(*named(s)) for s in (args.scenario or ["persistent:sim.slowdown=[1.0,4.0]",
                                                                     "transient:sim=stragglers"])]
    contenders = [named(c) for c in (args.contender or CONTENDER_SETS[args.contender_set or "default"])]
    header = (
        f"{args.model}, {'MNIST' if args.data_root else 'synthetic data'}, batch 64 per worker, {args.devices} workers, "
        f"an 'epoch' = {args.batches_per_epoch} batches per worker, test accuracy after each; "
        f"clock: {'training time, validation excluded' if args.clock == 'training' else 'wall-clock, validation included'}"
    )
    target = max(args.target)
    if args.summarize:
        results = {s.name: read_results(args.out / f"time_to_accuracy_{s.name}.csv") for s in scenarios}
        names = list(next(iter(results.values())))
        grid = {name: {c: summarize(curves, target) for c, curves in by.items()} for name, by in results.items()}
        print("\n".join(grid_lines(grid, scenarios, names, target)))
        plot_grid(grid_speedups(grid, names), args.out / f"time_to_accuracy_grid_{args.model}.png",
                  f"{args.model}: time to {target:.0%}, speed-up against {names[0]} (medians over seeds)")
        return
    workdir = Path(tempfile.mkdtemp(prefix="lh_tta_"))
    start = time.perf_counter()
    try:
        if args.lrs:
            sweep: dict[str, dict[float, list[list[dict[str, float]]]]] = {name: {} for name, _ in contenders}
            sweep_seeds = args.sweep_seeds or args.seeds
            for seed in sweep_seeds:
                for lr in args.lrs:
                    for name, overrides in contenders:
                        sweep[name].setdefault(lr, []).append(run(
                            f"sweep_{name}_lr{lr:g}_s{seed}", [f"seed={seed}", "sim=default", *overrides,
                                                               f"optimizer.lr={lr}"], common, workdir, args.clock))
            chosen = best_learning_rates(sweep, target)
            table = "\n".join([f"### learning-rate sweep ({args.model}, no stragglers)", "", header, "",
                               f"Median over seeds {', '.join(map(str, sweep_seeds))} [range].", "",
                               *sweep_lines(sweep, target, chosen)]) + "\n"
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"time_to_accuracy_lr_sweep_{args.model}.md").write_text(table)
            print(table, flush=True)
            contenders = [(name, [*overrides, f"optimizer.lr={chosen[name]}"]) for name, overrides in contenders]
        grid: dict[str, dict[str, dict[str, list[float]]]] = {}
        for scenario in scenarios:
            results: dict[str, list[list[dict[str, float]]]] = {name: [] for name, _ in contenders}
            for seed in args.seeds:  # seeds in the outer loop: a busy spell disturbs every contender alike
                for name, overrides in contenders:
                    # a contender's own overrides come last, so that they can take something out of the scenario
                    results[name].append(run(f"{scenario.name}_{name}_s{seed}", [f"seed={seed}", *scenario.overrides,
                                                                                   *overrides], common, workdir,
                                             args.clock, scenario.contention(seed)))
            description = f"{header}; sim: `{' '.join(scenario.overrides)}`"
            if scenario.competitors:
                description += "; competitors (cores, processes, duty): " + ", ".join(map(str, scenario.competitors))
            table = write_outputs(scenario.name, results, args.seeds, args.target, args.out, description)
            print(table, flush=True)
            grid[scenario.name] = {name: summarize(curves, target) for name, curves in results.items()}
        if len(scenarios) > 1:
            names = [name for name, _ in contenders]
            lines = [f"### time to {target:.0%}: speed-up against {names[0]} ({args.model})", "", header, "",
                     "Median over seeds " + ", ".join(map(str, args.seeds)) + "; learning rates: "
                     + ", ".join(f"{name} {next((o for o in reversed(ov) if o.startswith('optimizer.lr=')), 'config')}"
                                 for name, ov in contenders), "", *grid_lines(grid, scenarios, names, target)]
            table = "\n".join(lines) + "\n"
            (args.out / f"time_to_accuracy_grid_{args.model}.md").write_text(table)
            plot_grid(grid_speedups(grid, names), args.out / f"time_to_accuracy_grid_{args.model}.png",
                      f"{args.model}: time to {target:.0%}, speed-up against {names[0]} (medians of {len(args.seeds)} seeds)")
            print(table, flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"benchmark wall time: {time.perf_counter() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
