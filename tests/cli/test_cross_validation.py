"""Cross-validation as one command: ``lightning-hybrid -m data=adni_caps data.split.fold=0,1 ...`` ends with each fold's
test metrics per scan and per subject, their mean and standard deviation, and each fold's best checkpoint, in a
table and summary.csv; the summary's arithmetic checked on job folders written as Hydra writes them."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import pytest

from clinicadl_cohort import make_cohort
from conftest import run_cli
from lightning_hybrid import run_folder
from lightning_hybrid.cli.sweep_summary import format_table, read_jobs, summarize


def job_folder(sweep: Path, number: int, overrides: list[str], metrics: dict | None, best: str = "") -> None:
    folder = sweep / str(number)
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if metrics is not None:
        (folder / "metrics.json").write_text(json.dumps(metrics))
        run_folder.write_record(folder, {}, "finished", best_checkpoint=best)


def test_folds_are_grouped_by_the_other_settings_and_averaged(tmp_path):
    baccs = {("0.001", "0"): 0.70, ("0.001", "1"): 0.80, ("0.001", "2"): 0.60, ("0.01", "0"): 0.50, ("0.01", "1"): 0.55}
    for n, ((lr, fold), bacc) in enumerate(baccs.items()):
        job_folder(tmp_path, n, ["data=adni_caps", f"optimizer.lr={lr}", f"data.split.fold={fold}"],
                   {"test/bacc": bacc, "test/subject/bacc": bacc + 0.05, "test/auc": 0.9}, f"ckpt-{n}.ckpt")
    job_folder(tmp_path, 5, ["data=adni_caps", "optimizer.lr=0.01", "data.split.fold=2"], None)  # a job that failed
    key, rows = summarize(read_jobs(tmp_path))
    assert key == "data.split.fold"
    mean = {r["settings"]: r for r in rows if r["fold"] == "mean"}
    std = {r["settings"]: r for r in rows if r["fold"] == "std"}
    first, second = "optimizer.lr=0.001", "optimizer.lr=0.01"  # what varies besides the fold
    assert mean[first]["scan/bacc"] == pytest.approx(0.70) and std[first]["scan/bacc"] == pytest.approx(0.10)
    assert mean[first]["subject/bacc"] == pytest.approx(0.75)
    assert mean[second]["scan/bacc"] == pytest.approx(0.525)
    assert std[second]["scan/bacc"] == pytest.approx(statistics.stdev([0.50, 0.55]))
    assert mean[second]["status"] == "2 of 3 folds"
    failed = next(r for r in rows if r["settings"] == second and r["fold"] == "2")
    assert failed["status"] == "no metrics" and math.isnan(failed["scan/bacc"])
    assert next(r for r in rows if r["fold"] == "1" and r["settings"] == first)["best_checkpoint"] == "ckpt-1.ckpt"
    table = format_table(key, rows)
    assert "cross-validation over data.split.fold (3 folds), optimizer.lr=0.001; test set:" in table
    assert "no metrics" in table


@pytest.mark.multiprocess
def test_a_cross_validation_is_one_command_and_ends_with_its_table(tmp_path):
    cohort = make_cohort(tmp_path / "cohort")
    sweep = tmp_path / "sweep"
    proc = run_cli(
        "-m", "data=adni_caps", f"data.source.caps_directory={cohort['caps']}", f"data.source.tsv_path={cohort['split']}",
        "data.split.fold=0,1", "data.view.image_shape=[16,16,16]", "data.view.spacing=[2.0,2.0,2.0]", "data.batch_size=2",
        "data.cache.dir=null", "data.num_workers=0", "model=resattnet3d_18", "model.base_channels=4",
        "trainer.max_epochs=1", "logger=csv", "callbacks=[model_checkpoint]", f"hydra.sweep.dir={sweep}",
        cwd=tmp_path, timeout=400,
    )
    out = proc.stdout
    assert "cross-validation over data.split.fold (2 folds)" in out, out[-3000:] + proc.stderr[-3000:]
    with open(sweep / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["fold"] for r in rows] == ["0", "1", "mean", "std"]
    for level in ("scan", "subject"):
        for metric in ("bacc", "sensitivity", "specificity", "auc"):
            values = [float(r[f"{level}/{metric}"]) for r in rows[:2]]
            assert all(0 <= v <= 1 for v in values)
            assert float(rows[2][f"{level}/{metric}"]) == pytest.approx(sum(values) / 2)
    for row, fold in zip(rows[:2], (0, 1)):
        assert Path(row["best_checkpoint"]).is_file() and Path(row["best_checkpoint"]).is_relative_to(sweep / str(fold))
    # each job's validation subjects are its fold's: the folds really differ
    logs = [(sweep / str(fold) / "cli.log").read_text() for fold in (0, 1)]
    assert "2_fold/split-0/validation_baseline.tsv" in logs[0] and "2_fold/split-1/validation_baseline.tsv" in logs[1]
