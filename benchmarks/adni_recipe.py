"""Paper 003's recipe on the ADNI-like benchmark: 3D-ResAttNet-18's balanced accuracy and training time.

    python benchmarks/adni_recipe.py                          # the whole recipe (about an hour on 2 cores)
    python benchmarks/adni_recipe.py --seeds 0 --contenders single --epochs 2   # a quick look
    python benchmarks/adni_recipe.py --contenders ddp hybrid --every-seed --extra "data.view.image_shape=[56,72,60]" \
        "data.view.spacing=[3.0,3.0,3.0]" model.base_channels=32   # the pipeline's accuracy against DDP's, 3 seeds each

The cohort (``lightning-hybrid data make-adni-like``: Colin27 with AAL hippocampi, AD atrophy, in
ClinicaDL's layout) is written into ``--cohort`` first when it is not there. Every contender trains
through the real CLI on ClinicaDL's split (``split/5_fold/split-0`` for training and validation,
``split/test_baseline.tsv`` for the test) at the CPU resolution of ``configs/data/adni_like.yaml``
(2 mm voxels, 80 x 104 x 88: the whole brain), picks its checkpoint by validation balanced accuracy,
and is scored on the test subjects' baseline scans:

* ``single``: one process, over ``--seeds`` (mean and spread of balanced accuracy, training time);
* ``ddp``, ``hybrid`` (the pipeline at its defaults: 2 stages, GABRA on the blocks' measured times, the
  micro-batch count chosen), ``balanced``: two processes computing the same updates as ``single`` (a global
  batch of 6), seed 0 (every seed with ``--every-seed``: the pipeline's accuracy against DDP's seed spread):
  seconds per epoch beside ``single``'s, and their accuracy as a check that they train the same model.

Prints a markdown table and writes ``benchmarks/results/adni_recipe.{json,md}``; the run folders stay
in ``--workdir`` (``benchmarks/gradcam_localisation.py --runs WORKDIR/single_seed*`` scores their
Grad-CAM maps).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from epoch_time import epoch_times

#: The recipe's settings (the learning rate from the sweep in recipes/akintoye2022_hybrid_adni/README.md).
RECIPE = ["model=resattnet3d_18", "optimizer=adam_mri", "optimizer.lr=3e-4",
          "callbacks=[model_checkpoint,epoch_timer]", "logger=csv", "trainer.enable_progress_bar=false"]
#: Two processes computing the updates of one process with batch 6.
CONTENDERS = {
    "single": [],
    "ddp": ["strategy=ddp", "trainer.devices=2", "data.batch_size=3"],
    "hybrid": ["strategy=hybrid", "trainer.devices=2"],
    "balanced": ["strategy=balanced", "trainer.devices=2", "data.batch_size=3"],
}


def cohort_overrides(cohort: Path) -> list[str]:
    return ["data=adni_like", f"data.source.caps_directory={cohort / 'caps'}", f"data.source.tsv_path={cohort / 'split'}",
            f"data.cache.dir={cohort / 'cache'}", "data.split.fold=0"]  # split-0 of the 5 folds


def ensure_cohort(cohort: Path, subjects: int, seed: int) -> None:
    if (cohort / "split" / "test_baseline.tsv").is_file():
        return
    print(f"writing the ADNI-like cohort ({subjects} subjects) to {cohort}", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "lightning_hybrid.cli", "data", "make-adni-like", str(cohort),
                    "--subjects", str(subjects), "--seed", str(seed)], check=True)


def train(name: str, overrides: list[str], run_dir: Path) -> dict:
    """One training run through the CLI; its test metrics, epoch times and wall time."""
    if not (run_dir / "metrics.json").is_file():  # a finished run is kept: rerunning the script resumes the table
        cmd = [sys.executable, "-m", "lightning_hybrid.cli", *overrides, f"hydra.run.dir={run_dir}"]
        print(f"[{name}] {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        (run_dir / "wall_s.txt").write_text(f"{time.perf_counter() - start:.1f}\n")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    times = epoch_times(run_dir)
    return {"name": name, "run": str(run_dir), "metrics": metrics, "epoch_s": times,
            "training_s": metrics.get("time/training_s", float("nan")), "wall_s": float((run_dir / "wall_s.txt").read_text())}


def summarise(runs: list[dict]) -> dict:
    bacc = [r["metrics"]["test/bacc"] for r in runs]
    steady = [t for r in runs for t in r["epoch_s"][1:]] or [t for r in runs for t in r["epoch_s"]]
    return {
        "seeds": len(runs),
        "bacc_mean": statistics.fmean(bacc), "bacc_sd": statistics.stdev(bacc) if len(bacc) > 1 else 0.0,
        "bacc_min": min(bacc), "bacc_max": max(bacc),
        **{k: statistics.fmean(r["metrics"][f"test/{k}"] for r in runs) for k in ("sensitivity", "specificity", "auc")},
        "subject_bacc": statistics.fmean(r["metrics"].get("test/subject/bacc", float("nan")) for r in runs),
        "epoch_s": statistics.fmean(steady),
        "training_min": statistics.fmean(r["training_s"] for r in runs) / 60,
        "wall_min": statistics.fmean(r["wall_s"] for r in runs) / 60,
    }


def table(results: dict[str, dict]) -> str:
    base = results["single"]["epoch_s"] if "single" in results else None
    lines = ["| contender | seeds | balanced accuracy (mean ± sd; min-max) | sensitivity | specificity | AUC | "
             "s/epoch | epoch time vs single | training (min) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        ratio = f"{r['epoch_s'] / base:.2f}" if base else "-"
        lines.append(
            f"| {name} | {r['seeds']} | {r['bacc_mean']:.3f} ± {r['bacc_sd']:.3f} ({r['bacc_min']:.3f}-{r['bacc_max']:.3f}) | "
            f"{r['sensitivity']:.3f} | {r['specificity']:.3f} | {r['auc']:.3f} | {r['epoch_s']:.1f} | {ratio} | "
            f"{r['training_min']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cohort", type=Path, default=Path("data/adni_like"))
    parser.add_argument("--subjects", type=int, default=300, help="subjects of a cohort written here (half AD, half CN)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=list(CONTENDERS))
    parser.add_argument("--every-seed", action="store_true", help="every contender over every seed (else single only)")
    parser.add_argument("--extra", nargs="*", default=[], help="more overrides for every contender")
    parser.add_argument("--workdir", type=Path, default=Path("benchmarks/results/adni_recipe_runs"))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()

    ensure_cohort(args.cohort, args.subjects, seed=0)
    common = [*cohort_overrides(args.cohort.resolve()), *RECIPE, f"trainer.max_epochs={args.epochs}", *args.extra]
    results, runs = {}, {}
    for name in args.contenders:
        seeds = args.seeds if name == "single" or args.every_seed else args.seeds[:1]
        runs[name] = [train(name, [*common, *CONTENDERS[name], f"seed={seed}"], args.workdir.resolve() / f"{name}_seed{seed}")
                      for seed in seeds]
        results[name] = summarise(runs[name])
        print(table(results), file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "adni_recipe.json").write_text(json.dumps({"settings": common, "results": results, "runs": runs}, indent=2))
    text = f"3D-ResAttNet-18 on the ADNI-like benchmark ({args.cohort}), {args.epochs} epochs, `{' '.join(common)}`\n\n{table(results)}\n"
    (args.out / "adni_recipe.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
