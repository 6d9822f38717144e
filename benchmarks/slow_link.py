"""Time to accuracy where the network is slow: DDP, its compression hooks, the delayed all-reduce, local SGD.

Two ranks on this machine, inside a network namespace (``lightning_hybrid.sim.link.ShapedLink``): its
loopback shaped to a rate by the kernel's token bucket (every byte the ranks send each other crosses it, and
is counted), or unshaped with every collective completing a latency after its data
(``sim.collective_latency_s``: a round trip a message step, 2 collectives at once; a real long link is
``benchmarks/long_link.py``'s), or with transient stragglers; the sources are
:data:`SOURCES` (``--sources``). Contenders (``--contenders``, names below): DDP; DDP with gradients in bf16
(``strategy=ddp_bf16``) or PowerSGD of rank 2 and 4 (``strategy=ddp_powersgd``); the delayed all-reduce
(``strategy=delayed_averaging``) by delayed gradient averaging, its default method, at delay 1, 2 and 4
(``dga_d*``) and by its other method, the average alone applied late (``pipe_d*``: with the momentum
lowered for the delay, kept, or DC-ASGD's compensation); local SGD (``local_sgd``) every 8, 32 or 64 steps,
the average a round late (``local_h32_d1``), with DiLoCo's outer step, or in 4 fragments in bf16 (``stream_h32``).

The time to a target accuracy is taken in two measurements, because every contender's updates are the same
whatever the network's speed (none adapts to timing: the delays, rounds and compressions are fixed), so that
the samples a run needs to reach the target do not depend on the source:

1. ``trajectories`` (no shaping): each contender trains in short epochs (``--batches-per-epoch`` per rank)
   and is tested after each on MNIST's test set, until the target or ``--max-epochs``: samples to the target.
   A learning-rate sweep first (``--lrs``, over ``--sweep-seeds``): each contender keeps the rate that needs
   the fewest samples (median over those seeds; a rate that misses the target in a seed loses); then every
   seed of ``--seeds`` at that rate. Final accuracy: after ``--max-epochs`` with ``--final-epochs``.
2. ``throughput``: each contender at its rate, ``--throughput-batches`` batches per rank (at least two
   rounds) under each source: training samples per second (from the first batch to the last, set-up
   excluded) and bytes through the link per sample.
``end_to_end`` (its own phase, not part of ``all``: hours through 10 Mbit/s): each contender trained inside each source
until the test that reached the target, ``--seeds``, at its swept rate: the time from the fit's start to the end of
that test (warm-up, tests and the agreement to stop included), measured rather than computed.

3. ``report``: time to the target = samples to it / samples per second under the source, per seed; medians,
   the ratio to DDP under the same source, and each source's best of each family.

``--pipeline``: the hybrid pipeline at its defaults (2 stages placed by GABRA on the blocks' measured times,
its micro-batch count chosen) against DDP, balanced data parallelism and fully sharded data parallelism
(``strategy=fsdp2``) for ResAttNet-18 on 48^3 volumes (synthetic, the ADNI-like cohort's view), under the
same sources: time per training sample and bytes per sample (throughput only: the pipeline's updates equal
DDP's), ``--repeats`` runs of each (medians and ranges). Every contender takes the same global batch,
``--pipeline-batch`` a rank (the pipeline the whole of it, in ``--pipeline-micro-batches``: ``auto`` by default).

    python benchmarks/slow_link.py --data-root ../shared/data/mnist --model lenet5 --target 0.98 \\
        --sources unshaped 100mbit stragglers --lrs 0.01 0.02 0.05 --sweep-seeds 0 1 2 --seeds 0 1 2

Writes to --out (benchmarks/results/): slow_link_<model>.json (every run) and .md (the tables). Needs root
for the namespaces (``ip netns``); without it, ``trajectories`` only.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_hybrid.sim.link import ShapedLink, why_not_shaped  # noqa: E402

#: name -> overrides (their learning rate is swept; momentum 0.9, batch 64 per rank, 2 ranks).
CONTENDERS = {
    "ddp": ["strategy=ddp"],
    "ddp_bf16": ["strategy=ddp_bf16", "strategy.fork_ranks=true"],
    "powersgd_r2": ["strategy=ddp_powersgd", "strategy.fork_ranks=true"],
    "powersgd_r4": ["strategy=ddp_powersgd", "strategy.ddp_kwargs.ddp_comm_state.matrix_approximation_rank=4",
                    "strategy.fork_ranks=true"],
    # DDP's own remedy for latency, fewer all-reduces: its gradients summed over k batches before one (no_sync)
    **{f"ddp_acc{k}": ["strategy=ddp", f"trainer.accumulate_grad_batches={k}"] for k in (2, 4, 8)},
    # the delayed all-reduce as users type it: delayed gradient averaging (the default method) at delay 1, 2, 4
    **{f"dga_d{d}": ["strategy=delayed_averaging", f"strategy.delay={d}", "strategy.fork_ranks=true"] for d in (1, 2, 4)},
    # its other method, the average alone applied late (Pipe-SGD): momentum 0.9 -> 0.4 (subtract, its default), or
    # kept at 0.9 (mean_delay: 0.889; uncorrected), or with DC-ASGD's compensation
    "pipe_d1": ["strategy=delayed_averaging", "strategy.method=pipe_sgd", "strategy.delay=1", "strategy.fork_ranks=true"],
    "pipe_d1_mean_delay": ["strategy=delayed_averaging", "strategy.method=pipe_sgd", "strategy.delay=1",
                           "strategy.momentum_correction=mean_delay", "strategy.fork_ranks=true"],
    "pipe_d1_uncorrected": ["strategy=delayed_averaging", "strategy.method=pipe_sgd", "strategy.delay=1",
                            "strategy.momentum_correction=null", "strategy.fork_ranks=true"],
    "pipe_d1_dc": ["strategy=delayed_averaging_dc", "strategy.delay=1", "strategy.fork_ranks=true"],
    "pipe_d2": ["strategy=delayed_averaging", "strategy.method=pipe_sgd", "strategy.delay=2", "strategy.fork_ranks=true"],
    **{f"local_h{h}": ["strategy=local_sgd", f"strategy.sync_every={h}", "strategy.fork_ranks=true"] for h in (8, 32, 64)},
    "local_h32_d1": ["strategy=local_sgd", "strategy.sync_every=32", "strategy.delay=1", "strategy.fork_ranks=true"],
    "local_h32_nesterov": ["strategy=local_sgd", "strategy.sync_every=32", "strategy.outer_optimizer=nesterov",
                           "strategy.fork_ranks=true"],
    "stream_h32": ["strategy=local_sgd", "strategy.sync_every=32", "strategy.fragments=4", "strategy.wire_dtype=bf16",
                   "strategy.fork_ranks=true"],
}
#: Where the time goes between the ranks: a link's rate (None: the namespace unshaped) and the simulator's
#: overrides. ``lat*``: the simulator's round trip (sim.collective_latency_s: a round trip a message step; not its
#: caller blocked: an overlapped exchange can hide it); ``stragglers``: every rank 8x slower with probability 0.1 a
#: step (the straggler grid's transient source, recipes/zhang2017_delay_sync).
SOURCES = {
    "unshaped": (None, []), "10gbit": ("10gbit", []), "1gbit": ("1gbit", []), "100mbit": ("100mbit", []),
    "10mbit": ("10mbit", []), "lat50ms": (None, ["sim.collective_latency_s=0.05"]),
    "lat200ms": (None, ["sim.collective_latency_s=0.2"]),
    "stragglers": (None, ["sim.straggle_prob=0.1", "sim.straggle_factor=8.0"]),
}
PIPELINE = {
    "ddp": ["strategy=ddp"],
    "balanced": ["strategy=balanced", "strategy.fork_ranks=true"],
    "fsdp": ["strategy=fsdp2", "strategy.fork_ranks=true"],
    # placed at set-up from its input's shape: without it the first batch places it (several seconds of block
    # timing for each micro-batch count), inside the one epoch this table times
    "hybrid": ["strategy=hybrid", "strategy.fork_ranks=true", "strategy.input_shape=[1,48,48,48]"],
}
BATCH = 64
RANKS = 2


COMMON = ["logger=csv", "cpu_threads_per_process=1", "watchdog_s=null", "progress=log"]


def csv_rows(run_dir: Path) -> list[dict]:
    """The rows of a run's CSV log (every metrics.csv under it)."""
    rows = []
    for path in run_dir.glob("csv/*/metrics.csv"):
        with open(path) as f:
            rows += list(csv.DictReader(f))
    return rows


def fresh(run_dir: Path) -> Path:
    """``run_dir``, emptied: an earlier invocation's run there would be read (or resumed) with this one's."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    return run_dir


def cli(overrides: list[str], run_dir: Path, link: ShapedLink | None = None, timeout: float = 3600) -> dict:
    """One run of the CLI (inside ``link``); its CSV log's rows, the bytes the link carried and the command's
    wall time."""
    command = [sys.executable, "-m", "lightning_hybrid.cli", *overrides, f"hydra.run.dir={fresh(run_dir)}", *COMMON]
    before = link.bytes_sent if link is not None else 0
    start = time.perf_counter()
    done = subprocess.run(link.wrap(command) if link is not None else command, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(overrides)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return {"rows": csv_rows(run_dir), "bytes": (link.bytes_sent - before) if link is not None else 0,
            "wall_s": time.perf_counter() - start}


def reached(rows: list[dict], args) -> dict:
    """From a run's CSV rows: each test's (samples, accuracy, seconds since the fit's start), and the first
    that reached ``args.target`` (None: none did)."""
    accuracy = {int(r["epoch"]): float(r["val/acc"]) for r in rows if r.get("val/acc")}
    elapsed = {int(r["epoch"]): float(r["time/elapsed_s"]) for r in rows if r.get("time/elapsed_s")}
    curve = [((epoch + 1) * args.batches_per_epoch * BATCH * RANKS, accuracy[epoch], elapsed.get(epoch))
             for epoch in sorted(accuracy)]
    first = next((point for point in curve if point[1] >= args.target), None)
    return {"curve": curve, "samples_to_target": first[0] if first else None,
            "seconds_to_target": first[2] if first else None}


def until_target(args) -> list[str]:
    """Overrides that test after each short epoch and stop at ``args.target`` (or ``args.max_epochs``)."""
    return [f"trainer.max_epochs={args.max_epochs}", f"trainer.limit_train_batches={args.batches_per_epoch}",
            "test=false", "callbacks=[epoch_timer,early_stopping]",
            f"callbacks.early_stopping.stopping_threshold={args.target}", "callbacks.early_stopping.patience=1000"]


def base(args: argparse.Namespace) -> list[str]:
    data = [f"data.root={args.data_root}", "data.val_set=test"] if args.data_root else ["data=synthetic"]
    model = ["model=mlp", "model.hidden=[4096,4096]", "model.activation=relu"] if args.model == "mlp20m" else \
        [f"model={args.model}"]
    return [*data, *model, "trainer.devices=2", f"data.batch_size={BATCH}", "optimizer.momentum=0.9"]


def trajectory(args, name: str, lr: float, seed: int, early_stop: bool = True) -> dict:
    """Test accuracy after each short epoch: [(samples, accuracy)], and the samples to the target (None: never)."""
    stop = until_target(args) if early_stop else [
        f"trainer.max_epochs={args.max_epochs}", f"trainer.limit_train_batches={args.batches_per_epoch}", "test=false",
        "callbacks=[epoch_timer]"]
    overrides = [*base(args), *CONTENDERS[name], f"optimizer.lr={lr}", f"seed={seed}", *stop]
    run = cli(overrides, args.out / "runs" / f"{args.model}_{name}_lr{lr}_s{seed}{'' if early_stop else '_full'}")
    per_epoch = sorted({int(r["epoch"]): float(r["val/acc"]) for r in run["rows"] if r.get("val/acc")}.items())
    curve = [((epoch + 1) * args.batches_per_epoch * BATCH * RANKS, acc) for epoch, acc in per_epoch]
    first = next((samples for samples, acc in curve if acc >= args.target), None)
    return {"name": name, "lr": lr, "seed": seed, "curve": curve, "samples_to_target": first,
            "final_acc": curve[-1][1] if curve else None}


def end_to_end(args, name: str, lr: float, source: str, seed: int) -> dict:
    """One contender trained under one source (:data:`SOURCES`) until the target: the time from the fit's start
    to the end of the test that first reached it (warm-up, every test, the agreement to stop included)."""
    rate, simulated = SOURCES[source]
    with ShapedLink(rate) as link:
        run = cli([*base(args), *CONTENDERS[name], *simulated, f"optimizer.lr={lr}", f"seed={seed}", *until_target(args)],
                  args.out / "runs" / f"{args.model}_{name}_{source}_s{seed}_e2e", link=link)
    return {"name": name, "link": source, "seed": seed, "lr": lr, **reached(run["rows"], args), "wall_s": run["wall_s"],
            "bytes": run["bytes"]}


def throughput(args, name: str, lr: float, source: str, table: dict, repeat: int = 0) -> dict:
    """Training samples per second of one contender under one source (:data:`SOURCES`), and the bytes the
    link carried per sample (``repeat``: which run of it)."""
    overrides = table[name]
    rounds = [int(o.split("=")[1]) for o in overrides if o.startswith("strategy.sync_every=")]
    batches = max(args.throughput_batches, 2 * rounds[0] if rounds else 0)
    rate, simulated = SOURCES[source]
    with ShapedLink(rate) as link:
        run = cli([*(base(args) if table is CONTENDERS else pipeline_base(args, name, batches)), *overrides, *simulated,
                   f"optimizer.lr={lr}", "trainer.max_epochs=1", f"trainer.limit_train_batches={batches}",
                   "trainer.limit_val_batches=0", "test=false", "callbacks=[epoch_timer]"],
                  args.out / "runs" / f"{args.model}_{name}_{source}_tp{f'_r{repeat}' if repeat else ''}", link=link)
    seconds = next(float(r["time/epoch_s"]) for r in run["rows"] if r.get("time/epoch_s"))
    batch = args.pipeline_batch if table is PIPELINE else BATCH
    trained = trained_batches(run["rows"])
    if trained != batches:  # an epoch shorter than the batches asked for: the samples would be counted wrong
        raise RuntimeError(f"{name} under {source} trained {trained} batches, not {batches}: a larger data set is needed")
    samples = batches * batch * RANKS  # the pipeline's batch is the global one (pipeline_base)
    return {"name": name, "link": source, "samples_per_s": samples / seconds, "bytes_per_sample": run["bytes"] / samples,
            "batches": batches, "repeat": repeat}


def marginal_bytes(args, name: str, lr: float, rate: str) -> dict:
    """Bytes through the link per training sample at steady state: two runs of one contender, ``n`` and ``3n``
    batches (``n``: two rounds, or 64 batches), the difference of their bytes over the difference of their
    samples (set-up, the start's broadcast and the final sync cancel out)."""
    rounds = [int(o.split("=")[1]) for o in CONTENDERS[name] if o.startswith("strategy.sync_every=")]
    n = max(64, 2 * rounds[0] if rounds else 0)
    measured = []
    for batches in (n, 3 * n):
        with ShapedLink(rate) as link:
            run = cli([*base(args), *CONTENDERS[name], f"optimizer.lr={lr}", "trainer.max_epochs=1",
                       f"trainer.limit_train_batches={batches}", "trainer.limit_val_batches=0", "test=false",
                       "callbacks=[epoch_timer]"], args.out / "runs" / f"{args.model}_{name}_{rate}_bytes{batches}", link=link)
        measured.append(run["bytes"])
    return {"name": name, "link": rate, "bytes_per_sample": (measured[1] - measured[0]) / (2 * n * BATCH * RANKS)}


def trained_batches(rows: list[dict]) -> int:
    """Optimizer steps of a one-epoch run, from its CSV log (the last row's step counts from 0)."""
    return max(int(r["step"]) for r in rows if r.get("step")) + 1


def pipeline_base(args, name: str, batches: int) -> list[str]:
    """The pipeline table's settings: the same global batch for every contender (a data-parallel rank
    takes ``--pipeline-batch``, the pipeline the ranks' sum in ``--pipeline-micro-batches``), and synthetic
    subjects enough for ``batches`` of them in an epoch (a subject gives about half a training scan)."""
    pipeline = name == "hybrid"
    batch = [f"data.batch_size={args.pipeline_batch * RANKS}", f"strategy.micro_batches={args.pipeline_micro_batches}"] \
        if pipeline else [f"data.batch_size={args.pipeline_batch}"]
    subjects = max(40, 2 * batches * args.pipeline_batch * RANKS + 16)
    return ["model=resattnet3d_18", "data=adni_phantoms", f"data.subjects={subjects}",
            f"data.root={(args.out / 'runs' / f'pipeline_data_{subjects}').resolve()}", "data.volume_shape=[48,48,48]",
            "data.view.image_shape=[48,48,48]", *batch, "data.cache.dir=null", "trainer.devices=2", "optimizer=adam_mri"]


def swept_lr(trajectories: list[dict], name: str, sweep_seeds: list[int], default: float) -> float:
    """The learning rate of ``name``'s sweep that needed the fewest samples to the target (median over
    ``sweep_seeds``; a seed that missed it counts as infinite; ties: the smaller rate); ``default`` unswept."""
    runs = [r for r in trajectories if r["name"] == name and r["seed"] in sweep_seeds]
    scores = {lr: median([r["samples_to_target"] or float("inf") for r in runs if r["lr"] == lr])
              for lr in {r["lr"] for r in runs}}
    return min(scores, key=lambda lr: (scores[lr], lr)) if scores else default


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase", choices=["all", "trajectories", "throughput", "end_to_end", "bytes", "report"], default="all")
    parser.add_argument("--bytes-link", default="100mbit", help="the link of the bytes phase (steady-state bytes per sample)")
    parser.add_argument("--data-root", default=None, help="MNIST folder (without it: synthetic data)")
    parser.add_argument("--model", default="lenet5", help="lenet5, or mlp20m (784-4096-4096-10, 20 M parameters)")
    parser.add_argument("--target", type=float, default=0.98)
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=list(CONTENDERS))
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.01, 0.02, 0.05])
    parser.add_argument("--sweep-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-epochs", type=int, default=40)
    parser.add_argument("--batches-per-epoch", type=int, default=64, help="per rank, between two tests of the "
                        "accuracy (each a sync point: local SGD's round ends there)")
    parser.add_argument("--final-epochs", type=int, default=0, help="also train --seeds this many epochs without "
                        "early stopping, for the final accuracy")
    parser.add_argument("--sources", "--links", nargs="+", default=["unshaped", "100mbit", "stragglers"],
                        choices=list(SOURCES), help="where the time between the ranks goes (SOURCES)")
    parser.add_argument("--throughput-batches", type=int, default=100)
    parser.add_argument("--pipeline", action="store_true", help="the pipeline's table (ResAttNet-18, 48^3) instead")
    parser.add_argument("--pipeline-batch", type=int, default=4, help="a data-parallel rank's batch (the pipeline: "
                        "the global batch, this times the ranks)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each pipeline-table contender under each source")
    parser.add_argument("--pipeline-micro-batches", default="auto", help="the pipeline's micro-batches a batch: auto "
                        "(its default: the count predicted fastest from its blocks' times) or a count")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"slow_link_{'pipeline' if args.pipeline else args.model}.json"
    results = json.loads(path.read_text()) if path.exists() else {"trajectories": [], "throughput": [], "final": []}
    results.setdefault("bytes", [])
    results.setdefault("end_to_end", [])
    if results.setdefault("target", args.target) != args.target:  # samples_to_target are to the file's target
        raise SystemExit(f"{path} holds runs to {results['target']:.0%}: pass --target {results['target']}, or --out elsewhere")

    def save() -> None:
        path.write_text(json.dumps(results, indent=1))

    def best_lr(name: str) -> float:
        return swept_lr(results["trajectories"], name, args.sweep_seeds, args.lrs[0])

    done = {(r["name"], r["lr"], r["seed"]) for r in results["trajectories"]}
    if not args.pipeline and args.phase in ("all", "trajectories"):
        for name in args.contenders:
            for lr in args.lrs:
                for seed in args.sweep_seeds:
                    if (name, lr, seed) not in done:
                        results["trajectories"].append(trajectory(args, name, lr, seed))
                        save()
                        print(f"[{name} lr={lr} seed={seed}] {results['trajectories'][-1]['samples_to_target']} samples")
            lr = best_lr(name)
            for seed in args.seeds:
                if (name, lr, seed) not in {(r["name"], r["lr"], r["seed"]) for r in results["trajectories"]}:
                    results["trajectories"].append(trajectory(args, name, lr, seed))
                    save()
                if args.final_epochs and (name, lr, seed) not in {(r["name"], r["lr"], r["seed"]) for r in results["final"]}:
                    full = trajectory(argparse.Namespace(**{**vars(args), "max_epochs": args.final_epochs}), name, lr, seed,
                                      early_stop=False)
                    results["final"].append(full)
                    save()
    if args.phase in ("all", "throughput"):
        reason = why_not_shaped()
        if reason:
            raise SystemExit(f"no shaped links here: {reason}")
        table = PIPELINE if args.pipeline else CONTENDERS
        if args.pipeline:
            names = list(PIPELINE)
        else:
            names = list(args.contenders)
        for source in args.sources:
            for repeat in range(args.repeats if args.pipeline else 1):  # contenders in turn, then again
                for name in names:
                    if any(r["name"] == name and r["link"] == source and r.get("repeat", 0) == repeat
                           for r in results["throughput"]):
                        continue
                    measured = throughput(args, name, 1e-4 if args.pipeline else best_lr(name), source, table, repeat)
                    results["throughput"].append(measured)
                    save()
                    print(f"[{name} {source}] {measured['samples_per_s']:.1f} samples/s, {measured['bytes_per_sample']:.0f} B/sample")
    if not args.pipeline and args.phase == "end_to_end":  # hours: its own phase, not part of "all"
        if not args.data_root:
            raise SystemExit("the end_to_end phase tests on MNIST: pass --data-root")
        if reason := why_not_shaped():
            raise SystemExit(f"no shaped links here: {reason}")
        for source in args.sources:
            for seed in args.seeds:  # contenders in turn, seed by seed: a drift in the machine's speed meets all
                for name in args.contenders:
                    if any(r["name"] == name and r["link"] == source and r["seed"] == seed for r in results["end_to_end"]):
                        continue
                    results["end_to_end"].append(end_to_end(args, name, best_lr(name), source, seed))
                    save()
                    run = results["end_to_end"][-1]
                    print(f"[{name} {source} seed {seed}] {run['seconds_to_target']} s to the target "
                          f"({run['samples_to_target']} samples; the command {run['wall_s']:.1f} s)", flush=True)
    if args.phase == "bytes":
        reason = why_not_shaped()
        if reason:
            raise SystemExit(f"no shaped links here: {reason}")
        for name in args.contenders:
            if not any(r["name"] == name and r["link"] == args.bytes_link for r in results["bytes"]):
                results["bytes"].append(marginal_bytes(args, name, best_lr(name), args.bytes_link))
                save()
                print(f"[{name} {args.bytes_link}] {results['bytes'][-1]['bytes_per_sample']:.0f} B/sample at steady state")
    report = pipeline_report(args, results) if args.pipeline else accuracy_report(args, results, best_lr)
    (path.with_suffix(".md")).write_text(report)
    print(report)


def accuracy_report(args, results: dict, best_lr) -> str:
    """Two tables: the samples each contender needs (against DDP's), and its time to the target under each
    source (against DDP's under the same source); then each source's best of each family."""
    rate_of = {(r["name"], r["link"]): r for r in results["throughput"]}
    samples_of: dict[str, list[int]] = {}
    lines = [f"Samples to {args.target:.0%} test accuracy ({args.model}, 2 ranks, batch {BATCH} each, momentum 0.9), "
             f"seeds {args.seeds}; each contender at its best learning rate of {args.lrs} (the median over seeds "
             f"{args.sweep_seeds}); samples counted every {args.batches_per_epoch * BATCH * RANKS}.", "",
             "| contender | lr | samples to target (median, range) | x DDP's samples | reached | final acc |",
             "|---|---|---|---|---|---|"]
    for name in args.contenders:
        lr = best_lr(name)
        runs = [r for r in results["trajectories"] if r["name"] == name and r["lr"] == lr and r["seed"] in args.seeds]
        samples = [r["samples_to_target"] for r in runs if r["samples_to_target"]]
        if runs and len(samples) == len(runs):
            samples_of[name] = samples
        finals = [r["final_acc"] for r in results["final"] if r["name"] == name and r["lr"] == lr] or \
                 [r["final_acc"] for r in runs]
        ddp = median(samples_of.get("ddp", []))
        ratio = f"{median(samples) / ddp:.2f}x" if samples and ddp == ddp else "-"
        spread = f"{min(samples)}-{max(samples)}" if samples else "-"
        lines.append(f"| {name} | {lr} | {median(samples):.0f} ({spread}) | {ratio} | {len(samples)}/{len(runs)} | "
                     f"{median([f for f in finals if f is not None]):.4f} |")
    lines += end_to_end_table(args, results)
    times: dict[tuple[str, str], float] = {}
    for name, samples in samples_of.items():
        for source in args.sources:
            if (name, source) in rate_of:
                times[(name, source)] = median([n / rate_of[(name, source)]["samples_per_s"] for n in samples])
    lines += ["", f"Time to {args.target:.0%}, the quotient (computed, not measured: each seed's samples over the "
              "samples per second measured under the source; median over seeds; `x DDP`: DDP's time over the "
              "contender's under the same source, above 1 faster).", "",
              "| contender | " + " | ".join(f"{source}: s (x DDP)" for source in args.sources)
              + f" | B/sample on a link | B/sample, steady state ({args.bytes_link}) |",
              "|---|" + "---|" * len(args.sources) + "---|---|"]
    steady = {r["name"]: r["bytes_per_sample"] for r in results.get("bytes", []) if r["link"] == args.bytes_link}
    for name in args.contenders:
        cells = []
        for source in args.sources:
            t, ddp = times.get((name, source)), times.get(("ddp", source))
            cells.append(f"{t:.1f} ({ddp / t:.2f}x)" if t and ddp else (f"{t:.1f}" if t else "n/a"))
        shaped = [rate_of[(name, source)]["bytes_per_sample"] for source in args.sources
                  if (name, source) in rate_of and SOURCES[source][0] is not None]
        flat = steady.get(name)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {median(shaped):.0f} | "
                     + (f"{flat:.0f}" if flat is not None else "-") + " |")
    families = {"the delayed all-reduce (DGA)": "dga_", "the delayed all-reduce (Pipe-SGD)": "pipe_",
                "local SGD": ("local_", "stream_"), "PowerSGD": "powersgd_"}
    ceiling = times.get(("ddp", "unshaped"))
    lines += ["", "Each source's best of each family, against DDP under the same source"
              + (f" (DDP unshaped: {ceiling:.1f} s)" if ceiling else "") + ":", ""]
    for source in args.sources:
        ddp = times.get(("ddp", source))
        if not ddp:
            continue
        best = []
        for family, prefix in families.items():
            ranked = sorted((t, n) for (n, s), t in times.items() if s == source and n.startswith(prefix))
            if ranked:
                best.append(f"{family} {ranked[0][1]} {ranked[0][0]:.1f} s ({ddp / ranked[0][0]:.2f}x)")
        lines.append(f"- {source}: DDP {ddp:.1f} s" + (f" ({ddp / ceiling:.1f}x its unshaped time)" if ceiling else "")
                     + "; " + "; ".join(best))
    base_rate = rate_of.get(("ddp", "unshaped"))
    for source in args.sources:
        latency = next((float(o.split("=")[1]) for o in SOURCES[source][1] if o.startswith("sim.collective_latency_s=")), None)
        if latency is not None and base_rate and ("ddp", source) in rate_of:
            step = 1000 * BATCH * RANKS / rate_of[("ddp", source)]["samples_per_s"]
            compute = 1000 * BATCH * RANKS / base_rate["samples_per_s"]
            lines.append(f"- {source}: DDP's step {step:.1f} ms against compute + its all-reduce's 2 round trips = "
                         f"{compute:.1f} + 2 x {1000 * latency:.0f} = {compute + 2000 * latency:.1f} ms (the model's check)")
    lines += ["", "A contender that misses the target in a seed gets no time (n/a)."]
    return "\n".join(lines) + "\n"


def end_to_end_table(args, results: dict) -> list[str]:
    """Time to the target measured end to end under each source: medians and ranges over the seeds, and DDP's
    median over the contender's under the same source."""
    runs = results.get("end_to_end", [])
    if not runs:
        return []
    sources = [s for s in args.sources if any(r["link"] == s for r in runs)]

    def seconds(name: str, source: str) -> list[float]:
        return [r["seconds_to_target"] for r in runs if r["name"] == name and r["link"] == source
                and r["seed"] in args.seeds and r["seconds_to_target"]]

    lines = ["", f"Time to {args.target:.0%} measured end to end under each source (the fit's start to the end of the "
             "test that reached it: warm-up, every test and the agreement to stop included; seconds, median and range "
             "over the seeds; `x DDP`: DDP's median over the contender's under the same source, above 1 sooner; "
             "`reached`: seeds that reached the target).", "",
             "| contender | lr | " + " | ".join(f"{source}: s (range) x DDP, reached" for source in sources) + " |",
             "|---|---|" + "---|" * len(sources)]
    for name in dict.fromkeys(r["name"] for r in runs if r["name"] in args.contenders):
        cells = []
        for source in sources:
            mine, ddp = seconds(name, source), median(seconds("ddp", source))
            tried = len([r for r in runs if r["name"] == name and r["link"] == source and r["seed"] in args.seeds])
            cells.append(f"{median(mine):.1f} ({min(mine):.1f}-{max(mine):.1f}) {ddp / median(mine):.2f}x, "
                         f"{len(mine)}/{tried}" if mine and ddp == ddp else f"n/a, {len(mine)}/{tried}")
        lr = next(r["lr"] for r in runs if r["name"] == name)
        lines.append(f"| {name} | {lr} | " + " | ".join(cells) + " |")
    return lines


def pipeline_report(args, results: dict) -> str:
    """One row a link and contender: the training time per sample (median of the runs, their range), DDP's and
    FSDP's medians over it under the same link, and the link's bytes per sample (the whole run's)."""
    lines = ["Pipeline against data parallelism: ResAttNet-18 on 48^3 volumes, 2 ranks, "
             f"global batch {args.pipeline_batch * RANKS} ({args.pipeline_batch} a data-parallel rank; the pipeline: "
             f"2 stages, the batch in {args.pipeline_micro_batches} micro-batches): "
             "training time per sample (ms; median of the runs, their range) inside each link, and DDP's and FSDP's "
             "medians over the contender's under the same link.", "",
             "| link | contender | ms a sample (range) | vs DDP | vs FSDP | MB through the link a sample |",
             "|---|---|---|---|---|---|"]
    runs: dict[tuple[str, str], list[dict]] = {}
    for r in results["throughput"]:
        runs.setdefault((r["name"], r["link"]), []).append(r)
    ms = {key: median([1000 / r["samples_per_s"] for r in values]) for key, values in runs.items()}
    for link in args.sources:
        for name in PIPELINE:
            if (name, link) not in ms:
                continue
            times = [1000 / r["samples_per_s"] for r in runs[(name, link)]]
            spread = f" ({min(times):.1f}-{max(times):.1f})" if len(times) > 1 else ""
            versus = [f"{ms[(other, link)] / ms[(name, link)]:.2f}x" if (other, link) in ms else "" for other in ("ddp", "fsdp")]
            megabytes = median([r["bytes_per_sample"] / 1e6 for r in runs[(name, link)]])
            lines.append(f"| {link} | {name} | {ms[(name, link)]:.1f}{spread} | {' | '.join(versus)} | {megabytes:.1f} |")
    lines += ["", "The link's bytes cover whole runs (set-up's broadcast of rank 0's model, the checkpoint gathered to "
              "rank 0), not only the timed batches."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
