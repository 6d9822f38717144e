"""The time-to-accuracy benchmark's tables, from hand-made curves (no training)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "time_to_accuracy.py"


@pytest.fixture(scope="module")
def tta():
    spec = importlib.util.spec_from_file_location("time_to_accuracy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def curve(*accuracies: float, epoch_s: float = 1.0) -> list[dict[str, float]]:
    return [{"epoch": k, "elapsed_s": (k + 1) * epoch_s, "val_acc": a} for k, a in enumerate(accuracies)]


def test_epoch_accuracy_is_the_mean_over_seeds_with_its_standard_error(tta):
    results = {"ddp": [curve(0.90, 0.96, 0.97), curve(0.92, 0.94)], "ssp": [curve(0.80, 0.95), curve(0.84, 0.97, 0.99)]}
    lines = tta.epoch_accuracy_lines(results)
    assert "epochs 1-2" in lines[1]  # only the epochs every run reached
    ddp, ssp = lines[-2], lines[-1]
    error = math.sqrt(((0.90 - 0.91) ** 2 + (0.92 - 0.91) ** 2) / 1) / math.sqrt(2)
    assert ddp == f"| ddp | 0.9100 +- {error:.4f} | 0.9500 +- {error:.4f} |"
    assert ssp.startswith("| ssp | 0.8200 +- 0.0200 | 0.9600 +- 0.0100 |")


def test_time_to_target_is_the_first_epoch_at_or_above_it(tta):
    stats = tta.summarize([curve(0.9, 0.97, 0.96, epoch_s=2.0), curve(0.9, 0.95)], target=0.97)
    assert stats["time"] == [4.0, math.inf] and stats["epochs"] == [2, math.inf]
    assert tta.median_and_range(stats["time"]) == "not reached (1/2)"


@pytest.fixture(scope="module")
def feature_matrix():
    spec = importlib.util.spec_from_file_location("feature_matrix", SCRIPT.with_name("feature_matrix.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def counts(global_step=16, batches=(8, 8), **other):
    return {"global_step": global_step, "epochs": len(batches), "validations": 2, "scheduler_steps": 0,
            "checkpoint_steps": [], "batches": list(batches), **other}


def test_the_feature_matrix_compares_exact_counts_with_its_reference(feature_matrix):
    differences = feature_matrix.count_differences
    ddp = [counts(), counts()]
    assert differences("balanced", "max_epochs", [counts(), counts()], ddp) is None
    assert differences("ssp", "max_steps", [counts(6), counts(6)], ddp) == "global_step 6 (ddp: 16)"
    assert "ranks end at different steps [16, 15]" in differences("delayed_averaging", "max_epochs", [counts(), counts(15)], ddp)
    assert "batches per epoch per rank" in differences("balanced", "max_epochs", [counts(), counts(batches=(8, 7))], ddp)
    # the server deals the batches: all ranks together train what DDP's do, however they are split
    assert differences("ssp", "max_epochs", [counts(batches=(12, 3)), counts(batches=(4, 13))], ddp) is None
    assert "all ranks [15, 15]" in differences("ssp", "max_epochs", [counts(batches=(12, 3)), counts(batches=(3, 12))], ddp)
    # the pipeline's stages each see every batch of the single process it is compared with
    single = [counts()]
    assert differences("hybrid", "max_epochs", [counts(), counts()], single) is None
    assert "batches per epoch per rank" in differences("hybrid", "max_epochs", [counts(), counts(batches=(4, 4))], single)


def test_the_grid_summary_round_trips_through_its_table_and_is_drawn(tta, tmp_path):
    pytest.importorskip("matplotlib", reason="the plots extra is not installed")
    from matplotlib.image import imread

    stats = {  # two scenarios, three contenders; ssp never reaches the target in the second
        "none": {"ddp": {"time": [10.0, 12.0, 11.0], "epoch_s": [1.0]}, "balanced": {"time": [10.0, 11.0, 12.0], "epoch_s": [1.0]},
                 "ssp": {"time": [5.5, 5.0, 6.0], "epoch_s": [1.0]}},
        "compute_persistent": {"ddp": {"time": [40.0, 44.0, 42.0], "epoch_s": [3.0]},
                               "balanced": {"time": [20.0, 21.0, 22.0], "epoch_s": [1.5]},
                               "ssp": {"time": [math.inf] * 3, "epoch_s": [1.0]}},
    }
    names = ["ddp", "balanced", "ssp"]
    speedups = tta.grid_speedups(stats, names)
    assert speedups["none"]["ssp"] == pytest.approx(11.0 / 5.5)
    assert speedups["compute_persistent"]["balanced"] == pytest.approx(2.0)
    assert math.isnan(speedups["compute_persistent"]["ssp"])
    scenarios = [tta.Scenario("none", []), tta.Scenario("compute_persistent", [], slowdown=4.0)]
    table = "\n".join(tta.grid_lines(stats, scenarios, names, 0.98))
    parsed = tta.speedups_from_table(table)
    assert parsed["none"] == pytest.approx({"ddp": 1.0, "balanced": 1.0, "ssp": 2.0}, abs=0.005)
    assert parsed["compute_persistent"]["balanced"] == pytest.approx(2.0) and math.isnan(parsed["compute_persistent"]["ssp"])
    out = tmp_path / "grid.png"
    assert tta.plot_grid(parsed, out, "test grid")
    height, width = imread(out).shape[:2]
    assert width > 600 and height > 300


@pytest.fixture(scope="module")
def plot_table():
    spec = importlib.util.spec_from_file_location("plot_table", SCRIPT.parent / "plot_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_recipe_table_is_read_by_its_header_and_drawn_as_bars(plot_table, tmp_path):
    markdown = "\n".join([
        "# results", "", "| run | other |", "|---|---|", "| x | 1 |", "",
        "| samples | 1 worker s/epoch | 2 workers s/epoch |", "|---|---|---|",
        "| 500,000 | 1.26 / 1.79 | **1.41** |", "| 1,000,000 | 3.14 | n/a |", "", "after the table",
    ])
    header, rows = plot_table.read_table(markdown, "| samples |")
    assert header == ["samples", "1 worker s/epoch", "2 workers s/epoch"]
    assert [row[0] for row in rows] == ["500,000", "1,000,000"]  # the table ends at its last row
    assert plot_table.first_number(rows[0][1]) == 1.26 and plot_table.first_number(rows[0][2]) == 1.41
    assert plot_table.first_number("1,000,000") == 1e6 and math.isnan(plot_table.first_number(rows[1][2]))
    with pytest.raises(ValueError, match="no table whose header starts with"):
        plot_table.read_table(markdown, "| contender |")
    with pytest.raises(ValueError, match="not in the table's header"):
        plot_table.plot(header, rows, ["3 workers s/epoch"], tmp_path / "x.png", "", "")
    pytest.importorskip("matplotlib", reason="the plots extra is not installed")
    from matplotlib.image import imread

    source = tmp_path / "README.md"
    source.write_text(markdown)
    out = tmp_path / "bars.png"
    assert plot_table.main([str(source), "--table", "| samples |", "--columns", "1 worker s/epoch",
                            "2 workers s/epoch", "--out", str(out), "--title", "t"]) == 0
    height, width = imread(out).shape[:2]
    assert width >= 600 and height >= 400


def test_the_feature_matrix_compares_trained_weights_with_ddps(feature_matrix, tmp_path):
    """A case whose settings promise DDP's result is WRONG when its weights differ from DDP's; other cases carry
    the difference beside their cell; a pipeline's ranks together hold the whole model."""
    import torch

    ddp = {"w": torch.zeros(3), "b": torch.ones(1)}
    assert feature_matrix.weight_difference({"w": torch.full((3,), 0.5), "b": torch.ones(1)}, ddp) == 0.5
    assert feature_matrix.weight_difference(None, ddp) is None
    for rank, part in enumerate(({"w": torch.zeros(3)}, {"b": torch.ones(1)})):
        torch.save(part, tmp_path / f"weights_rank{rank}.pt")
    assert feature_matrix.read_weights(tmp_path).keys() == {"w", "b"}
    done = subprocess.CompletedProcess([], 0, "", "")
    record = {"current_epoch": 2, "batches": [[1.0], [1.0]]}
    (tmp_path / "record.json").write_text(json.dumps(record))
    torch.save({"w": torch.full((3,), 1e-3)}, tmp_path / "weights_rank0.pt")
    assert feature_matrix.classify("balanced", "max_epochs", tmp_path, done, None, ddp)[0] == "WRONG"
    assert feature_matrix.classify("delayed_averaging", "max_epochs", tmp_path, done, None, ddp) == \
        ("ok (Δ 1e-03)", "weights 0.001 from DDP's")
