"""The end of a sweep (``lightning-hybrid -m ...``): one table, and ``summary.csv``, of every job's test metrics;
where the sweep runs the folds of a cross-validation (``data.split.fold=0,1,2,3,4``: of ClinicaDL's k-fold, or
of the k-fold made here from a CSV with ``data.split.folds=5``), each fold's row and the mean +- standard deviation over the folds, per
scan and per subject, with each fold's best checkpoint: how the field reports ADNI results.

    lightning-hybrid -m data=adni_caps data.split.fold=0,1,2,3,4 model=resattnet3d_18
    ...
    cross-validation over data.split.fold (5 folds); test set:
      data.split.fold  scan/bacc  scan/sensitivity  ...  subject/auc  best checkpoint
      0               0.820             0.760  ...        0.938  .../0/checkpoints/epoch009.ckpt
      ...
      mean            0.788             0.872  ...        0.926  5 of 5 folds
      std             0.030             0.145  ...        0.024

:func:`read_jobs` and :func:`summarize` are plain Python over the sweep's folders (each job's
``.hydra/overrides.yaml``, ``metrics.json`` and run record); :class:`SweepSummary` is the Hydra
callback (``configs/hydra/default.yaml``) that calls them when the sweep ends.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback

from lightning_hybrid import run_folder

#: Overrides that pick a cross-validation fold: of ClinicaDL's split folders or of the k-fold made here from a CSV.
FOLD_KEYS = ("data.split.fold",)
#: The test metrics reported, in this order, where the jobs have them (per scan, then per subject).
METRICS = ("bacc", "sensitivity", "specificity", "auc", "acc", "loss")
LEVELS = {"scan": "test/", "subject": "test/subject/"}
#: The metrics of the printed table (summary.csv has them all): a diagnosis's as the field reports them.
TABLE_METRICS = ("bacc", "sensitivity", "specificity", "auc")


@dataclass
class Job:
    """One job of the sweep: its folder, its overrides (``key -> value`` as typed), metrics and best checkpoint."""

    folder: Path
    overrides: dict[str, str]
    metrics: dict[str, float] | None  # None: the job wrote none (it failed or was stopped)
    best_checkpoint: str = ""


@dataclass
class Group:
    """The jobs that differ only in the fold: a cross-validation (or, without a fold key, jobs one by one)."""

    settings: dict[str, str]
    jobs: list[Job] = field(default_factory=list)


def read_jobs(sweep_dir: Path) -> list[Job]:
    """The jobs of a sweep folder (Hydra's ``<sweep dir>/<job number>/``), in job order."""
    jobs = []
    folders = [p for p in Path(sweep_dir).iterdir() if (p / ".hydra" / "overrides.yaml").is_file()]
    for folder in sorted(folders, key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else p.name)):
        overrides = dict(o.split("=", 1) for o in yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text()) or []
                         if "=" in o)
        metrics_file = folder / "metrics.json"
        metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else None
        record = run_folder.read_record(folder) or {}
        jobs.append(Job(folder, overrides, metrics, record.get("best_checkpoint") or ""))
    return jobs


def fold_key(jobs: Sequence[Job]) -> str | None:
    """The override that varies across the jobs and picks a fold (:data:`FOLD_KEYS`), if any."""
    for key in FOLD_KEYS:
        if len({job.overrides.get(key) for job in jobs}) > 1:
            return key
    return None


def varying(jobs: Sequence[Job]) -> set[str]:
    """The overrides whose value differs between the jobs."""
    return {k for job in jobs for k in job.overrides if len({j.overrides.get(k) for j in jobs}) > 1}


def groups(jobs: Sequence[Job], key: str) -> list[Group]:
    """The jobs grouped by the overrides that vary across the sweep but ``key``, in the order they first appear."""
    others = varying(jobs) - {key}
    found: dict[tuple, Group] = {}
    for job in jobs:
        settings = {k: v for k, v in job.overrides.items() if k in others}
        found.setdefault(tuple(sorted(settings.items())), Group(settings)).jobs.append(job)
    return list(found.values())


def columns(jobs: Sequence[Job]) -> list[tuple[str, str]]:
    """(level, metric) pairs that some job reports, scan level first."""
    names = set().union(*(job.metrics or {} for job in jobs))
    return [(level, m) for level, prefix in LEVELS.items() for m in METRICS if prefix + m in names]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (``nan`` for one value), as k-fold results are reported."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan


def summarize(jobs: Sequence[Job]) -> tuple[str | None, list[dict[str, Any]]]:
    """The fold key and the summary's rows: per job, then (with a fold key) ``mean`` and ``std`` per group.

    Each row holds the group's settings (as one string), the fold (or job folder), each
    ``<level>/<metric>`` value and the best checkpoint. Jobs without metrics are rows saying so, left
    out of the mean.
    """
    key = fold_key(jobs)
    cols = columns(jobs)
    rows = []
    swept = varying(jobs)
    for group in groups(jobs, key) if key else [Group({}, list(jobs))]:  # no folds: one table, a job per row
        settings = " ".join(f"{k}={v}" for k, v in group.settings.items())
        for job in group.jobs:
            shown = " ".join(f"{k}={v}" for k, v in job.overrides.items() if k in swept) or job.folder.name
            row = {"settings": settings, "fold": job.overrides.get(key, "") if key else shown,
                   "best_checkpoint": job.best_checkpoint, "status": "ok" if job.metrics is not None else "no metrics"}
            for level, metric in cols:
                row[f"{level}/{metric}"] = (job.metrics or {}).get(LEVELS[level] + metric, math.nan)
            rows.append(row)
        if key:
            done = [r for r in rows[-len(group.jobs):] if r["status"] == "ok"]
            stats = {c: mean_std([r[c] for r in done]) for c in (f"{lv}/{m}" for lv, m in cols)}
            for i, name in enumerate(("mean", "std")):
                rows.append({"settings": settings, "fold": name, "best_checkpoint": "",
                             "status": f"{len(done)} of {len(group.jobs)} folds",
                             **{c: v[i] for c, v in stats.items()}})
    return key, rows


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    names = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=names, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def format_table(key: str | None, rows: Sequence[dict[str, Any]]) -> str:
    """The summary as text: a block per group, ``mean`` and ``std`` rows under a cross-validation's folds."""
    if not rows:
        return "no jobs with results in this sweep"
    metric_cols = [c for c in rows[0] if "/" in c and c.split("/")[1] in TABLE_METRICS]
    if not any(c.endswith("/bacc") for c in metric_cols):  # not a diagnosis: accuracy
        metric_cols = [c for c in rows[0] if c.endswith("/acc")]
    lines = []
    for settings in dict.fromkeys(r["settings"] for r in rows):
        mine = [r for r in rows if r["settings"] == settings]
        folds = [r for r in mine if r["fold"] not in ("mean", "std")]
        head = (f"cross-validation over {key} ({len(folds)} folds)" if key else f"{len(folds)} jobs") + \
            f"{', ' + settings if settings else ''}; test set:"
        widths = [max([len(key or "job"), 4, *(len(str(r["fold"])) for r in mine)])] + [max(len(c), 6) for c in metric_cols]
        lines += [head, "  " + "  ".join([f"{key or 'job':<{widths[0]}}"] + [f"{c:>{w}}" for c, w in zip(metric_cols, widths[1:])])
                  + "  best checkpoint"]
        for row in mine:
            values = [f"{row[c]:>{w}.3f}" if not math.isnan(row[c]) else f"{'-':>{w}}" for c, w in zip(metric_cols, widths[1:])]
            note = row["best_checkpoint"] if row["status"] == "ok" else "" if row["fold"] == "std" else row["status"]
            lines.append("  " + "  ".join([f"{row['fold']:<{widths[0]}}"] + values) + ("  " + note if note else ""))
    return "\n".join(lines)


class SweepSummary(Callback):
    """Hydra callback: when a sweep ends, print :func:`format_table` and write ``summary.csv`` in its folder."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        key, rows = summarize(read_jobs(sweep_dir))
        if rows:
            write_csv(sweep_dir / "summary.csv", rows)
        print(format_table(key, rows) + (f"\n(also in {sweep_dir / 'summary.csv'})" if rows else ""), flush=True)
