"""Both of paper 003's tasks as the field reports them: 5-fold cross-validation on the ADNI-like benchmark,
AD vs CN and pMCI vs sMCI, each fold tested on the subjects ClinicaDL's split held out.

    python benchmarks/adni_cross_validation.py                       # both tasks, 5 folds
    python benchmarks/adni_cross_validation.py --tasks pMCI_vs_sMCI --folds 2 --epochs 2   # a quick look

Each task's cohort is ``lightning-hybrid data make-adni-like`` (``--diagnoses AD CN`` or ``pMCI sMCI``:
MCI's atrophy milder and partly present), written into ``--workdir`` first when it is not there. Each
task is then the one command a user types,

    lightning-hybrid -m data=adni_like data.task=TASK data.split.fold=0,1,2,3,4 model=resattnet3d_18 ...

``pMCI_vs_sMCI_from_AD_vs_CN`` is pMCI vs sMCI with each fold started from the weights of AD vs CN's
run of the same fold (``transfer_path=.../sweep_AD_vs_CN/${data.split.fold}``), as ClinicaDL's evaluation
(Wen et al. 2020) trains its MCI networks.

whose sweep ends with its table (``summary.csv``: each fold's test metrics per scan and per subject,
mean and standard deviation); this script reads the two tables and prints them beside paper 003's
accuracies and the leakage-free literature's balanced accuracies. A finished sweep is kept: rerunning
prints its table again. ``--image-shape``, ``--spacing`` and ``--base-channels`` size the work to the
machine (the defaults: 3D-ResAttNet-18 at 32 base channels and 3 mm voxels, the whole brain, so that
ten trainings fit in about half an hour on 2 CPU cores). The learning rate is the recipe's (Adam at 3e-4,
the best of 3e-5, 1e-4 and 3e-4 on AD vs CN in recipes/akintoye2022_hybrid_adni), or each task's best
of ``--lrs`` by the folds' mean best validation balanced accuracy (never the test set).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

#: The tasks, the diagnoses their cohort holds, and what others report for them: paper 003's best test
#: accuracy (3D-ResAttNet-18, its Table 3, one split of unstated construction) and the leakage-free
#: balanced accuracy of subject-level 3D CNNs on ADNI (Wen et al. 2020, ClinicaDL).
#: ``from``: the run starts from the weights of that task's run of the same fold (``transfer_path``), as
#: ClinicaDL's evaluation trains its MCI networks from the AD vs CN ones; such a run uses its data task's
#: cohort and runs after the task it starts from.
TASKS = {
    "AD_vs_CN": {"diagnoses": ["AD", "CN"], "paper003": "0.92-0.96 accuracy", "leakage_free": "about 0.80-0.90"},
    "pMCI_vs_sMCI": {"diagnoses": ["pMCI", "sMCI"], "paper003": "0.80-0.82 accuracy", "leakage_free": "about 0.70-0.75"},
    "pMCI_vs_sMCI_from_AD_vs_CN": {"data_task": "pMCI_vs_sMCI", "from": "AD_vs_CN", "diagnoses": ["pMCI", "sMCI"],
                                   "paper003": "", "leakage_free": "about 0.70-0.75"},
}
METRICS = ("bacc", "sensitivity", "specificity", "auc")


def ensure_cohort(folder: Path, diagnoses: list[str], subjects: int, seed: int) -> None:
    if (folder / "split" / "test_baseline.tsv").is_file():
        return
    print(f"writing the ADNI-like cohort ({subjects} subjects, {' and '.join(diagnoses)}) to {folder}",
          file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "lightning_hybrid.cli", "data", "make-adni-like", str(folder),
                    "--subjects", str(subjects), "--diagnoses", *diagnoses, "--seed", str(seed)], check=True)


#: The recipe's learning rate: its sweeps keep the plain folder name (``sweep_TASK``).
RECIPE_LR = 3e-4


def sweep_folder(args: argparse.Namespace, task: str, lr: float) -> Path:
    return args.workdir / (f"sweep_{task}" if lr == RECIPE_LR else f"sweep_{task}_lr{lr:g}")


def validation_bacc(sweep: Path, folds: int) -> float:
    """The mean over folds of the best validation balanced accuracy (the checkpoint each fold tests):
    what picks a task's learning rate, never the test set."""
    best = []
    for fold in range(folds):
        (metrics,) = (sweep / str(fold)).glob("csv/*/metrics.csv")
        with open(metrics) as f:
            best.append(max(float(r["val/bacc"]) for r in csv.DictReader(f) if r.get("val/bacc")))
    return sum(best) / len(best)


def cross_validate(task: str, cohort: Path, sweep: Path, args: argparse.Namespace, lr: float,
                   source: Path | None = None) -> list[dict]:
    """The user's command for ``task``'s cross-validation at ``lr`` (from ``source``'s folds' weights);
    the rows of its ``summary.csv``."""
    if not (sweep / "summary.csv").is_file():
        folds = ",".join(str(k) for k in range(args.folds))
        transfer = [f"transfer_path={source.resolve()}/${{data.split.fold}}"] if source else []
        command = [
            sys.executable, "-m", "lightning_hybrid.cli", "-m", "data=adni_like",
            f"data.task={TASKS[task].get('data_task', task)}", *transfer,
            f"data.source.caps_directory={cohort / 'caps'}", f"data.source.tsv_path={cohort / 'split'}",
            f"data.cache.dir={cohort / 'cache'}", f"data.split.fold={folds}",
            f"data.view.image_shape=[{','.join(map(str, args.image_shape))}]", f"data.view.spacing=[{','.join(map(str, args.spacing))}]",
            "model=resattnet3d_18", f"model.base_channels={args.base_channels}", "optimizer=adam_mri",
            f"optimizer.lr={lr}", f"trainer.max_epochs={args.epochs}", "logger=csv", "callbacks=[model_checkpoint]",
            "trainer.enable_progress_bar=false", f"hydra.sweep.dir={sweep}",
        ]
        print(f"[{task}] {' '.join(command[3:])}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=sys.stderr)
        (sweep / "wall_s.txt").write_text(f"{time.perf_counter() - start:.1f}\n")
    with open(sweep / "summary.csv") as f:
        return list(csv.DictReader(f))


def cell(rows: list[dict], level: str, metric: str) -> str:
    mean = next(r for r in rows if r["fold"] == "mean")[f"{level}/{metric}"]
    std = next(r for r in rows if r["fold"] == "std")[f"{level}/{metric}"]
    return f"{float(mean):.3f} ± {float(std):.3f}"


def ceiling(cohort: Path, disease: str) -> tuple[float, float]:
    """What the cohort allows at best: the balanced accuracy of the best threshold on each baseline
    subject's true severity (in-sample, so optimistic) and that severity's AUC (the generator's
    ``truth.tsv``): no image model can beat what the severity that drew the atrophy gives."""
    with open(cohort / "truth.tsv") as f:
        rows = [r for r in csv.DictReader(f, delimiter="\t") if r["session_id"] == "ses-M000"]
    truth = [(float(r["severity"]), r["diagnosis"] == disease) for r in rows]
    positives = sum(y for _, y in truth)
    negatives = len(truth) - positives
    best = max((sum(s > t and y for s, y in truth) / positives + sum(s <= t and not y for s, y in truth) / negatives) / 2
               for t, _ in truth)
    pairs = sum((sp > sn) + 0.5 * (sp == sn) for sp, yp in truth if yp for sn, yn in truth if not yn)
    return best, pairs / (positives * negatives)


def table(results: dict[str, list[dict]], args: argparse.Namespace, chosen: dict[str, float],
          validation: dict[str, dict[float, float]]) -> str:
    lines = [
        f"3D-ResAttNet-18 ({args.base_channels} base channels), {args.folds}-fold cross-validation, "
        f"{args.image_shape[0]} x {args.image_shape[1]} x {args.image_shape[2]} voxels of {args.spacing[0]:g} mm, "
        f"Adam at each task's learning rate (of {', '.join(f'{lr:g}' for lr in args.lrs)}, by validation), {args.epochs} "
        "epochs, best validation balanced accuracy's checkpoint, test subjects' baseline scans (mean ± sd over the folds):",
        "",
        "| task | lr | level | balanced accuracy | sensitivity | specificity | AUC | paper 003 | leakage-free literature (bACC) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for task, rows in results.items():
        for level in ("scan", "subject"):
            lines.append(f"| {task.replace('_vs_', ' vs ').replace('_from_', ' from ')} | {chosen[task]:g} | {level} | "
                         + " | ".join(cell(rows, level, m) for m in METRICS)
                         + f" | {TASKS[task]['paper003'] if level == 'scan' else ''} | "
                         + f"{TASKS[task]['leakage_free'] if level == 'scan' else ''} |")
    lines += ["", "The cohorts' ceiling (the best threshold on the true severity of each baseline subject, in-sample; "
              "that severity's AUC):", ""]
    for task in results:
        cohort = args.workdir / f"cohort_{TASKS[task].get('data_task', task)}"
        if "from" not in TASKS[task]:
            bacc, auc = ceiling(cohort, TASKS[task]["diagnoses"][0])
            lines.append(f"- {task.replace('_vs_', ' vs ')}: balanced accuracy {bacc:.3f}, AUC {auc:.3f}")
    lines += ["", "Mean best validation balanced accuracy per learning rate (what picked each task's):", ""]
    for task, by_lr in validation.items():
        lines.append(f"- {task}: " + ", ".join(f"lr {lr:g} {bacc:.3f}" for lr, bacc in by_lr.items()))
    lines += ["", "Per fold (balanced accuracy per scan):", ""]
    for task, rows in results.items():
        folds = [r for r in rows if r["fold"] not in ("mean", "std")]
        lines.append(f"- {task}: " + ", ".join(f"fold {r['fold']} {float(r['scan/bacc']):.3f}" for r in folds))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("benchmarks/results/adni_cross_validation"))
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--subjects", type=int, default=300, help="subjects per cohort, half of each diagnosis")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lrs", type=float, nargs="+", default=[RECIPE_LR],
                        help="Adam learning rates to sweep per task; each task's is picked by validation")
    parser.add_argument("--lr-tasks", nargs="+", choices=list(TASKS), default=None,
                        help="the tasks that sweep --lrs (default: all); the others train at the recipe's 3e-4")
    parser.add_argument("--base-channels", type=int, default=32)
    parser.add_argument("--image-shape", type=int, nargs=3, default=[56, 72, 60])
    parser.add_argument("--spacing", type=float, nargs=3, default=[3.0, 3.0, 3.0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    results, chosen, validation = {}, {}, {}
    for task in sorted(args.tasks, key=lambda t: "from" in TASKS[t]):  # a transfer after its source
        source = TASKS[task].get("from")
        if source and source not in chosen:
            parser.error(f"{task} starts from {source}'s runs: run --tasks {source} {task}")
        cohort = args.workdir / f"cohort_{TASKS[task].get('data_task', task)}"
        ensure_cohort(cohort, TASKS[task]["diagnoses"], args.subjects, args.seed)
        lrs = args.lrs if args.lr_tasks is None or task in args.lr_tasks else [RECIPE_LR]
        runs = {lr: cross_validate(task, cohort, sweep_folder(args, task, lr), args, lr,
                                   sweep_folder(args, source, chosen[source]) if source else None) for lr in lrs}
        validation[task] = {lr: validation_bacc(sweep_folder(args, task, lr), args.folds) for lr in lrs}
        chosen[task] = max(lrs, key=validation[task].get)
        results[task] = runs[chosen[task]]
    text = table(results, args, chosen, validation)
    print(text)
    (args.workdir / "cross_validation.md").write_text(text + "\n")
    (args.workdir / "cross_validation.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                                     "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
