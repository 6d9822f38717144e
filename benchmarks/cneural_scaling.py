"""cNeural (paper 002) scaling: shard load time and epoch time against workers; resident vs reload.

Three measurements on one shard store, each with its contenders side by side in one run:

1. load: W worker processes read their shares of the store at the same moment (each with
   ``--load-threads`` threads, md5-checked); the time until the last has its share resident, for
   each W (the paper's Fig. 5). The store is read once beforehand, so every W reads from the
   page cache: this measures decoding and verification, not the disk.
2. epoch: batch-mode training (``strategy=cneural``, the 784-40-10 sigmoid MLP) through the real
   CLI with W workers; seconds per training epoch (median over epochs after the first) and the
   time each worker waited at the end-of-pass exchange (Fig. 7 and 8).
3. resident vs reload: the same training, with the shards kept resident against re-read from
   the store every epoch (``data.resident=false``: the paper's MapReduce baseline reloads every
   epoch); seconds per epoch measured as the time between consecutive epoch ends (the reload
   included), and the ratio.

    lightning-hybrid data augment-mnist --root ../shared/data/mnist --out /tmp/mnist_500k --samples 500000
    python benchmarks/cneural_scaling.py --store /tmp/mnist_500k --workers 1 2 --epochs 5

Writes benchmarks/results/cneural_scaling.{json,md} (or --out).
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lightning_hybrid.data.shards import ShardStore, assign_shards


# ---------------------------------------------------------------------- 1. load time
def _load_share(root: str, workers: int, rank: int, threads: int, barrier, results) -> None:
    store = ShardStore(root)
    barrier.wait()
    start = time.time()
    x, _ = store.load(assign_shards(store.num_shards, workers, rank), threads=threads)
    results.put((rank, start, time.time(), len(x)))


def load_time(root: str, workers: int, threads: int) -> tuple[float, int]:
    """Seconds from the common start until the last of ``workers`` processes holds its share."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_load_share, args=(root, workers, r, threads, barrier, results)) for r in range(workers)]
    for p in procs:
        p.start()
    rows = [results.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a loading worker exited with {p.exitcode}")
    start = min(r[1] for r in rows)
    return max(r[2] for r in rows) - start, sum(r[3] for r in rows)


# ---------------------------------------------------------------------- 2./3. training through the CLI
def _epoch_rows(run_dir: Path) -> list[dict[str, float]]:
    rows = []
    for path in run_dir.glob("csv/*/metrics.csv"):
        with open(path) as f:
            rows += [{k: float(v) for k, v in row.items() if v} for row in csv.DictReader(f)]
    return sorted((r for r in rows if "time/epoch_s" in r), key=lambda r: r["epoch"])


def train(store: str, workers: int, epochs: int, extra: list[str], workdir: Path, name: str) -> dict:
    run_dir = workdir / name
    cmd = [
        sys.executable, "-m", "lightning_hybrid.cli", "experiment=gu2013_cneural", f"data.train_store={store}",
        "data.val_store=null", "data.test_store=null", "test=false", "ckpt_path=null", "callbacks=[epoch_timer]", "~callbacks.model_checkpoint",
        f"trainer.devices={workers}", f"trainer.max_epochs={epochs}", "trainer.limit_val_batches=0",
        "trainer.enable_progress_bar=false", "allow_cpu_oversubscription=true", f"hydra.run.dir={run_dir}", *extra,
    ]
    print(f"[{name}] {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = _epoch_rows(run_dir)
    if len(rows) < 3:
        raise RuntimeError(f"{name}: {len(rows)} epochs logged; run at least 3 (--epochs)")
    between_ends = [b["time/elapsed_s"] - a["time/elapsed_s"] for a, b in zip(rows, rows[1:])]
    wait = [statistics.fmean(r[f"cneural/worker{w}/wait_s"] for r in rows[1:]) for w in range(workers)]
    return {
        "name": name, "workers": workers,
        "epoch_s": statistics.median(r["time/epoch_s"] for r in rows[1:]),
        "epoch_to_epoch_s": statistics.median(between_ends),
        "exchange_wait_s": max(wait),
        "train_acc": rows[-1].get("train/acc", float("nan")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True, help="a training store (lightning-hybrid data pack / augment-mnist)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--load-workers", type=int, nargs="+", default=None, help="default: --workers")
    parser.add_argument("--load-threads", type=int, default=4)
    parser.add_argument("--load-repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--skip", nargs="*", default=[], choices=["load", "epoch", "reload"])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()

    store = ShardStore(args.store)
    size_mib = sum(s["bytes"] for s in store.shards) / 2**20
    report: dict = {"store": args.store, "samples": store.num_samples, "shards": store.num_shards, "MiB": size_mib,
                    "cores": os.cpu_count()}
    lines = [f"Store: {store.num_samples:,} samples in {store.num_shards} shards ({size_mib:.0f} MiB), "
             f"{os.cpu_count()} cores", ""]

    if "load" not in args.skip:
        store.load(list(range(store.num_shards)))  # warm the page cache: every W reads from memory
        loads = []
        for w in args.load_workers or args.workers:
            times = [load_time(args.store, w, args.load_threads)[0] for _ in range(args.load_repeats)]
            loads.append({"workers": w, "load_s": statistics.median(times), "runs": times})
        base = loads[0]["load_s"]
        lines += ["1. Load time (the last worker's share resident; median of "
                  f"{args.load_repeats})", "", "| workers | load s | speed-up |", "|---|---|---|"]
        lines += [f"| {r['workers']} | {r['load_s']:.2f} | {base / r['load_s']:.2f}x |" for r in loads]
        lines.append("")
        report["load"] = loads

    common = [f"data.batch_size={args.batch_size}"]
    workdir = Path(tempfile.mkdtemp(prefix="lh_cneural_"))
    if "epoch" not in args.skip:
        runs = [train(args.store, w, args.epochs, common, workdir, f"resident_w{w}") for w in args.workers]
        base = runs[0]["epoch_s"]
        lines += ["2. Time per epoch, batch mode, resident shards (median over epochs 2..)", "",
                  "| workers | s/epoch | speed-up | end-of-pass wait s | train acc |", "|---|---|---|---|---|"]
        lines += [f"| {r['workers']} | {r['epoch_s']:.2f} | {base / r['epoch_s']:.2f}x | {r['exchange_wait_s']:.3f} | "
                  f"{r['train_acc']:.3f} |" for r in runs]
        lines.append("")
        report["epoch"] = runs

    if "reload" not in args.skip:
        w = max(args.workers)
        resident = train(args.store, w, args.epochs, common, workdir, f"resident_again_w{w}")
        reload = train(args.store, w, args.epochs, [*common, "data.resident=false",
                                                     "trainer.reload_dataloaders_every_n_epochs=1"],
                       workdir, f"reload_w{w}")
        ratio = reload["epoch_to_epoch_s"] / resident["epoch_to_epoch_s"]
        lines += [f"3. Resident vs reloading the shards every epoch ({w} workers; epoch end to epoch end)", "",
                  "| data | s/epoch | ratio |", "|---|---|---|",
                  f"| resident | {resident['epoch_to_epoch_s']:.2f} | 1.00x |",
                  f"| reload every epoch | {reload['epoch_to_epoch_s']:.2f} | {ratio:.2f}x slower |", ""]
        report["reload"] = {"resident": resident, "reload": reload, "ratio": ratio}

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cneural_scaling.json").write_text(json.dumps(report, indent=1))
    table = "\n".join(lines)
    (args.out / "cneural_scaling.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
