"""Time to accuracy through a real long link, end to end: DDP, DDP accumulating gradients, the delayed all-reduce.

Two ranks, each in a network namespace of its own, joined by a delay line
(:class:`lightning_hybrid.sim.link.DelayedLink`: TUN devices and a process holding every packet half the round
trip each way): the backends' real TCP (windows, acknowledgements, slow start, gloo's own protocol) meets the
latency. Each rank is one node of a run (``trainer.num_nodes=2``, ``trainer.devices=1``), launched in its
namespace as a cluster's node would be. Sources: ``--rtt-ms`` round trips.

Phases (``--phase``; each skips what the results file already holds):

1. ``probe``: the line's round trip (64-byte TCP ping-pong, median of 20) and bulk throughput (16 MB, default
   socket buffers), and what the line itself did (packets written more than 1 ms late, the worst lateness,
   drops).
2. ``steps``: each contender's time a step (``--step-batches`` batches, the epoch timer's first batch to last)
   through the line, under the simulator at the same round trip (``sim.collective_latency_s``: a round trip
   a message step, as many collectives at once as gloo runs) with both ranks on loopback, and with no
   latency (compute alone): the simulator's step over the line's, and DDP's step against compute plus its
   all-reduce as measured through the line.
3. ``accuracy``: each contender through the line, tested on MNIST's test set every ``--batches-per-epoch``
   batches a rank, until the target (``--target``) or ``--max-epochs``, ``--seeds``: the time from the fit's
   start to the end of the test that first reached the target (warm-up, every test and the agreement to stop
   included) and the whole command's wall time; medians, ranges, and DDP's median over each contender's.

Learning rates: each contender at its best of one sweep, read from ``--sweep`` (``benchmarks/slow_link.py
--phase trajectories``'s results file: samples to the target do not depend on the link), e.g.::

    python benchmarks/slow_link.py --phase trajectories --data-root ../shared/data/mnist \\
        --contenders ddp ddp_acc2 ddp_acc4 ddp_acc8 dga_d2 dga_d4 local_h32 --lrs 0.02 0.05 0.1 --sweep-seeds 0 1 --seeds 0 1 \\
        --out benchmarks/results/long_link
    python benchmarks/long_link.py --data-root ../shared/data/mnist   # as root (network namespaces, TUN)

Writes benchmarks/results/long_link.json (every run) and long_link.md (the tables).
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from slow_link import BATCH, COMMON, CONTENDERS, RANKS, base, csv_rows, fresh, reached, swept_lr  # noqa: E402

from lightning_hybrid.comm.regime import round_trips, sent_bytes  # noqa: E402
from lightning_hybrid.sim.link import DelayedLink, measure, why_not_delayed  # noqa: E402

def through_line(overrides: list[str], run_dir: Path, link: DelayedLink, timeout: float) -> dict:
    """One run with a rank at each end of ``link``: rank 0's CSV rows and the command's wall time."""
    command = [sys.executable, "-m", "lightning_hybrid.cli", *overrides, "trainer.devices=1",
               f"trainer.num_nodes={RANKS}", f"hydra.run.dir={fresh(run_dir)}", *COMMON]
    start = time.perf_counter()
    ranks = [subprocess.Popen(link.wrap(command, end), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for end in range(RANKS)]
    try:
        outputs = [rank.communicate(timeout=timeout)[0] for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
    if any(rank.returncode for rank in ranks):
        tails = "\n".join(f"--- rank {r}:\n{out[-3000:]}" for r, out in enumerate(outputs))
        raise RuntimeError(f"{' '.join(overrides)} failed through the line ({[r.returncode for r in ranks]}):\n{tails}")
    return {"rows": csv_rows(run_dir), "wall_s": time.perf_counter() - start}


def on_loopback(overrides: list[str], run_dir: Path, timeout: float) -> dict:
    """One run with both ranks on this machine's loopback (the simulator's way)."""
    command = [sys.executable, "-m", "lightning_hybrid.cli", *overrides, f"trainer.devices={RANKS}",
               f"hydra.run.dir={fresh(run_dir)}", *COMMON]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(overrides)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return {"rows": csv_rows(run_dir)}


def settings(args, name: str, lr: float) -> list[str]:
    """The contender's overrides without the rank count (each runner sets its own)."""
    return [o for o in base(args) if not o.startswith("trainer.devices=")] + [*CONTENDERS[name], f"optimizer.lr={lr}"]


def step_s(rows: list[dict], batches: int) -> float:
    """Seconds a batch: the epoch timer's epoch over its batches."""
    return next(float(r["time/epoch_s"]) for r in rows if r.get("time/epoch_s")) / batches


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def calibrate_worker(numel: int, compute_s: float = 0.01, steps: int = 30) -> None:
    """At one end of the line (``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` set): a training-like loop,
    ``compute_s`` of busy work then an all-reduce of ``numel`` float32 values, ``steps`` times; rank 0
    prints the median all-reduce time (the first five left out: TCP's window opening) as JSON."""
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=int(os.environ["NODE_RANK"]), world_size=RANKS,
                            init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}")
    tensor, times = torch.zeros(numel), []
    for _ in range(steps):
        end = time.perf_counter() + compute_s
        while time.perf_counter() < end:
            pass
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        print(json.dumps({"all_reduce_s": statistics.median(times[5:])}), flush=True)
    dist.destroy_process_group()


def calibrate(link: DelayedLink, round_trip_s: float, numel: int) -> dict:
    """The line's rate for an all-reduce of ``numel`` values in a training loop: its bytes per rank over its
    time less its round trips (:func:`~lightning_hybrid.comm.regime.round_trips`)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--calibrate-worker", str(numel)]
    ends = [subprocess.Popen(link.wrap(command, end), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True) for end in range(RANKS)]
    out = [end.communicate(timeout=300)[0] for end in ends][0]
    seconds = json.loads(out.strip().splitlines()[-1])["all_reduce_s"]
    left = seconds - round_trip_s * round_trips("all_reduce", RANKS, numel)
    return {"all_reduce_s": seconds, "numel": numel,
            "bytes_per_s": sent_bytes("all_reduce", RANKS, 4 * numel) / left if left > 1e-4 else None}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase", choices=["all", "probe", "steps", "accuracy", "report"], default="all")
    parser.add_argument("--calibrate-worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--numel", type=int, default=61706, help="the model's parameters (LeNet-5's: 61706): the "
                        "all-reduce the line's rate is fitted to")
    parser.add_argument("--data-root", default=None, help="MNIST folder (without it: synthetic data; accuracy needs it)")
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--rtt-ms", type=float, nargs="+", default=[50.0, 200.0], help="the line's round trips")
    parser.add_argument("--step-contenders", nargs="+", default=["ddp", "dga_d1", "dga_d2", "dga_d4"],
                        choices=list(CONTENDERS))
    parser.add_argument("--step-batches", type=int, default=60)
    parser.add_argument("--step-repeats", type=int, default=3, help="runs of each (medians in the table)")
    parser.add_argument("--contenders", nargs="+", default=["ddp", "ddp_acc2", "ddp_acc4", "ddp_acc8", "dga_d2"],
                        choices=list(CONTENDERS))
    parser.add_argument("--accuracy-rtt-ms", type=float, nargs="+", default=[50.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target", type=float, default=0.98)
    parser.add_argument("--max-epochs", type=int, default=30)
    parser.add_argument("--batches-per-epoch", type=int, default=64, help="per rank, between two tests")
    parser.add_argument("--sweep", type=Path, default=ROOT / "benchmarks/results/long_link/slow_link_lenet5.json")
    parser.add_argument("--sweep-seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--timeout-s", type=float, default=2400)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    args = parser.parse_args(argv)
    if args.calibrate_worker is not None:
        return calibrate_worker(args.calibrate_worker)
    runs = args.out / "long_link_runs"
    path = args.out / "long_link.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    for key in ("probe", "steps", "accuracy"):
        results.setdefault(key, [])
    sweep = json.loads(args.sweep.read_text())["trajectories"] if args.sweep.exists() else []

    def save() -> None:
        path.write_text(json.dumps(results, indent=1))

    def lr_of(name: str) -> float:
        return swept_lr(sweep, name, args.sweep_seeds, 0.02)

    if args.phase != "report" and (reason := why_not_delayed()):
        raise SystemExit(f"no long link here: {reason}")
    if args.phase in ("all", "probe"):
        for rtt in args.rtt_ms:
            if not any(p["rtt_ms"] == rtt for p in results["probe"]):
                with DelayedLink(rtt / 2000) as link:
                    measured = measure(link)
                results["probe"].append({"rtt_ms": rtt, **measured, "line": link.stats})
                save()
                print(f"[line {rtt:g} ms] {json.dumps(results['probe'][-1])}")
            probe = next(p for p in results["probe"] if p["rtt_ms"] == rtt)
            if "calibration" not in probe:
                with DelayedLink(rtt / 2000) as link:
                    probe["calibration"] = calibrate(link, probe["rtt_s"], args.numel)
                save()
                print(f"[line {rtt:g} ms] the model's all-reduce: {json.dumps(probe['calibration'])}")
    if args.phase in ("all", "steps"):
        batches = ["trainer.max_epochs=1", f"trainer.limit_train_batches={args.step_batches}",
                   "trainer.limit_val_batches=0", "test=false", "callbacks=[epoch_timer]"]
        for repeat in range(args.step_repeats):  # contenders in turn, then again: a drift meets them all
            for rtt in args.rtt_ms:
                for name in args.step_contenders:
                    if any(s["rtt_ms"] == rtt and s["name"] == name and s.get("repeat", 0) == repeat
                           for s in results["steps"]):
                        continue
                    overrides = [*settings(args, name, lr_of(name)), *batches]
                    with DelayedLink(rtt / 2000) as link:
                        line = through_line(overrides, runs / f"{name}_line{rtt:g}_steps", link, args.timeout_s)
                    simulated = on_loopback([*overrides, f"sim.collective_latency_s={rtt / 1000}"],
                                            runs / f"{name}_sim{rtt:g}_steps", args.timeout_s)
                    compute = on_loopback(overrides, runs / f"{name}_compute_steps", args.timeout_s)
                    results["steps"].append({"rtt_ms": rtt, "name": name, "repeat": repeat,
                                             "line_s": step_s(line["rows"], args.step_batches),
                                             "sim_s": step_s(simulated["rows"], args.step_batches),
                                             "compute_s": step_s(compute["rows"], args.step_batches), "line": link.stats})
                    save()
                    print(f"[steps {name} {rtt:g} ms #{repeat}] {json.dumps(results['steps'][-1])}")
        for rtt in args.rtt_ms:
            rate = next((p.get("calibration", {}).get("bytes_per_s") for p in results["probe"] if p["rtt_ms"] == rtt), None)
            for entry in [e for e in results["steps"] if e["rtt_ms"] == rtt and "fitted_sim_s" not in e and rate]:
                fitted = on_loopback([*settings(args, entry["name"], lr_of(entry["name"])), *batches,
                                      f"sim.collective_latency_s={rtt / 1000}", f"sim.collective_bytes_per_s={rate}"],
                                     runs / f"{entry['name']}_fitted{rtt:g}_steps", args.timeout_s)
                entry["fitted_sim_s"] = step_s(fitted["rows"], args.step_batches)
                save()
                print(f"[steps {entry['name']} {rtt:g} ms, fitted simulator] {1000 * entry['fitted_sim_s']:.1f} ms")
    if args.phase in ("all", "accuracy"):
        if not args.data_root:
            raise SystemExit("the accuracy phase tests on MNIST: pass --data-root")
        stop = ["callbacks=[epoch_timer,early_stopping]", f"callbacks.early_stopping.stopping_threshold={args.target}",
                "callbacks.early_stopping.patience=1000"]
        for rtt in args.accuracy_rtt_ms:
            for seed in args.seeds:  # contenders in turn, seed by seed: a drift in the machine's speed meets all
                for name in args.contenders:
                    if any(a["rtt_ms"] == rtt and a["name"] == name and a["seed"] == seed for a in results["accuracy"]):
                        continue
                    lr = lr_of(name)
                    overrides = [*settings(args, name, lr), f"seed={seed}", f"trainer.max_epochs={args.max_epochs}",
                                 f"trainer.limit_train_batches={args.batches_per_epoch}", "test=false", *stop]
                    with DelayedLink(rtt / 2000) as link:
                        run = through_line(overrides, runs / f"{name}_line{rtt:g}_s{seed}", link, args.timeout_s)
                    results["accuracy"].append({"rtt_ms": rtt, "name": name, "seed": seed, "lr": lr,
                                                **reached(run["rows"], args), "wall_s": run["wall_s"], "line": link.stats})
                    save()
                    print(f"[accuracy {name} {rtt:g} ms seed {seed}] {json.dumps(results['accuracy'][-1])}")
    report = render(args, results)
    path.with_suffix(".md").write_text(report)
    print(report)


def render(args, results: dict) -> str:
    lines = [f"Through a delay line (`lightning_hybrid.sim.link.DelayedLink`), {args.model}, 2 ranks (each in a namespace), "
             f"batch {BATCH} a rank, momentum 0.9.", "", "The line, measured before the runs:", "",
             "| set round trip | ping-pong (median, min-max) | bulk (16 MB) | packets > 1 ms late | worst lateness |",
             "|---|---|---|---|---|"]
    for p in results["probe"]:
        line = p["line"] or {}
        lines.append(f"| {p['rtt_ms']:g} ms | {1000 * p['rtt_s']:.1f} ms ({1000 * p['rtt_min_s']:.1f}-"
                     f"{1000 * p['rtt_max_s']:.1f}) | {p['bulk_bytes_per_s'] / 1e6:.1f} MB/s | "
                     f"{line.get('late', 0)} of {line.get('packets', 0)} | {1000 * line.get('worst_late_s', 0):.1f} ms |")
    calibrated = {p["rtt_ms"]: p["calibration"] for p in results["probe"] if p.get("calibration")}
    lines += ["", "The model's all-reduce in a training loop through the line (10 ms of compute between): "
              + "; ".join(f"{rtt:g} ms: {1000 * c['all_reduce_s']:.1f} ms "
                          f"({c['all_reduce_s'] / (rtt / 1000):.2f} round trips; fitted rate "
                          + (f"{c['bytes_per_s'] / 1e6:.2f} MB/s)" if c["bytes_per_s"] else "none)")
                          for rtt, c in sorted(calibrated.items())), "",
              "A step (ms; the median of each row's runs, with the line's range where there are several): through the line; in the simulator at the same round trip (a round trip a message step, "
              "gloo's 2 collectives at once), then with the line's fitted rate too (`sim.collective_bytes_per_s`); "
              f"compute alone. DDP's prediction: compute + its all-reduce as measured in the loop above.", "",
              "| round trip | contender | line | simulator | / line | fitted simulator | / line | compute | "
              "DDP's prediction / line |", "|---|---|---|---|---|---|---|---|---|"]
    for rtt, name in dict.fromkeys((s["rtt_ms"], s["name"]) for s in results["steps"]):
        mine = [s for s in results["steps"] if s["rtt_ms"] == rtt and s["name"] == name]
        line, sim, compute = (median([s[key] for s in mine]) for key in ("line_s", "sim_s", "compute_s"))
        fitted = median([s["fitted_sim_s"] for s in mine if "fitted_sim_s" in s])
        c = calibrated.get(rtt)
        predicted = (compute + c["all_reduce_s"]) / line if name == "ddp" and c else None
        spread = f" ({1000 * min(s['line_s'] for s in mine):.1f}-{1000 * max(s['line_s'] for s in mine):.1f})" \
            if len(mine) > 1 else ""
        lines.append(f"| {rtt:g} ms | {name} | {1000 * line:.1f}{spread} | {1000 * sim:.1f} | {sim / line:.2f} | "
                     + (f"{1000 * fitted:.1f} | {fitted / line:.2f}" if fitted == fitted else "- | -")
                     + f" | {1000 * compute:.1f} | " + (f"{predicted:.2f}" if predicted else "-") + " |")
    lines += ["", f"Time to {args.target:.0%} through the line, end to end (the fit's start to the end of the test that "
              "reached it; every test, warm-up and the agreement to stop included); medians and ranges over the seeds; "
              "`x DDP`: DDP's median over the contender's (above 1: sooner).", "",
              "| round trip | contender | lr | seconds to target | x DDP | samples to target | command wall s | reached |",
              "|---|---|---|---|---|---|---|---|"]
    for rtt in sorted({a["rtt_ms"] for a in results["accuracy"]}):
        ddp = median([a["seconds_to_target"] for a in results["accuracy"] if a["rtt_ms"] == rtt and a["name"] == "ddp"
                      and a["seconds_to_target"]])
        for name in dict.fromkeys(a["name"] for a in results["accuracy"] if a["rtt_ms"] == rtt):
            mine = [a for a in results["accuracy"] if a["rtt_ms"] == rtt and a["name"] == name]
            seconds = [a["seconds_to_target"] for a in mine if a["seconds_to_target"]]
            samples = [a["samples_to_target"] for a in mine if a["samples_to_target"]]
            t = median(seconds)
            lines.append(f"| {rtt:g} ms | {name} | {mine[0]['lr']} | {t:.1f} ({min(seconds, default=0):.1f}-"
                         f"{max(seconds, default=0):.1f}) | " + (f"{ddp / t:.2f}x" if seconds and ddp == ddp else "-")
                         + f" | {median(samples):.0f} | {median([a['wall_s'] for a in mine]):.1f} | "
                         f"{len(seconds)}/{len(mine)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
