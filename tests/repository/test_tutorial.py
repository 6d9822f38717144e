"""docs/your-module.md's script (examples/own_module.py) as users run it: a plain LightningModule and
a folder of sample files, under every alias with ``import lightning as L`` (2 CPU processes, each rank
running the script, as Lightning starts them), and with ``pytorch_lightning`` after the two import
changes the script names; partitioned inference of the trained model. Each run must learn (the
untrained model is at chance, 0.5)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import SUPPORT, Zygote, clean_env
from suite_configs import suite_aliases

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "own_module.py"
#: Every strategy class once (ssp_async, ssp_bounded and delayed_averaging_dc are settings of ssp and delayed_averaging,
#: run through the command in tests/cli/test_commands.py).
TRAINING = sorted(alias for alias in suite_aliases()
                  if alias not in ("partitioned_inference", "ssp_async", "ssp_bounded", "delayed_averaging_dc"))

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from own_module import write_example_data
    finally:
        sys.path.remove(str(SCRIPT.parent))
    root = tmp_path_factory.mktemp("own_module_data")
    write_example_data(root, samples=256)
    return root


def run(script: Path, out: Path, *args: str) -> dict:
    proc = Zygote.run([str(script), "--out", str(out), "--epochs", "2", *args], clean_env(PYTHONWARNINGS="ignore"), out.parent, 240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((out / ("predict.json" if "partitioned_inference" in args else "metrics.json")).read_text())
    return {**result, "output": proc.stdout + proc.stderr}


@pytest.mark.parametrize("alias", TRAINING)
def test_the_script_trains_a_user_s_module_under_every_alias_with_lightning(tmp_path, data, alias):
    result = run(SCRIPT, tmp_path / "run", "--strategy", alias, "--data", str(data))
    assert result["strategy"] == suite_aliases()[alias][0].__name__
    assert result["acc"] >= 0.9, result
    if alias == "balanced":  # the script configures no logging: the report still speaks, once per epoch
        assert result["output"].count("straggler report, epoch") == 2, result["output"][-3000:]


@pytest.mark.parametrize("alias", ["ssp"])  # the import changes are the same under every alias
def test_the_script_with_pytorch_lightning_after_the_two_import_changes(tmp_path, data, alias):
    source = SCRIPT.read_text()
    changed = source.replace("import lightning as L  #", "import pytorch_lightning as L  #").replace(
        "from lightning_hybrid.lightning.straggler import", "from lightning_hybrid.straggler import")
    assert changed.count("pytorch_lightning as L") == 2 and "lightning_hybrid.lightning" not in changed.split('"""', 2)[2]
    script = tmp_path / "own_module_pl.py"
    script.write_text(changed)
    result = run(script, tmp_path / "run", "--strategy", alias, "--data", str(data))
    assert result["acc"] >= 0.9, result


def test_partitioned_inference_predicts_with_the_trained_model(tmp_path, data):
    trained = run(SCRIPT, tmp_path / "run", "--strategy", "balanced", "--data", str(data))
    predicted = run(SCRIPT, tmp_path / "run", "--strategy", "partitioned_inference", "--data", str(data),
                    "--checkpoint", str(tmp_path / "run" / "model.ckpt"))
    assert predicted["strategy"] == "PartitionedInferenceStrategy"
    assert predicted["acc"] == pytest.approx(trained["acc"], abs=1e-6), "the same model on the same validation samples"


# ---------------------------------------------------------------------- requirements refused before workers start
REFUSALS = {
    ("ssp", "--iterable"): "SSPStrategy deals sample indices to its workers from the server, so the training data must be a torch "
                           "DataLoader over a map-style dataset (with __len__ and __getitem__); got a DataLoader over Stream",
    ("balanced", "--iterable"): "BalancedDataParallelStrategy deals each rank its share of every global batch by sample index, so "
                                "the training data must be a torch DataLoader over a map-style dataset",
    ("ssp", "--batch-sampler"): "SSPStrategy needs a training DataLoader with a batch_size",
    ("balanced", "--batch-sampler"): "BalancedDataParallelStrategy needs global_batch= when the training DataLoader has a "
                                     "batch_sampler of its own",
}


@pytest.mark.parametrize(("alias", "data"), list(REFUSALS), ids=lambda v: v.strip("-"))
def test_training_data_a_strategy_cannot_deal_is_refused_before_other_processes_start(tmp_path, alias, data):
    script = SUPPORT / "namespace_script.py"
    proc = Zygote.run([str(script), str(tmp_path), "--namespace", "lightning", "--strategy", alias, data],
                      clean_env(PYTHONWARNINGS="ignore"), tmp_path, 120)
    assert proc.returncode != 0 and REFUSALS[alias, data] in proc.stderr, proc.stderr[-3000:]
    assert "Initializing distributed" not in proc.stderr + proc.stdout, "refused before any process group or rank"


def test_an_iterable_dataset_trains_under_delayed_averaging_as_under_ddp(tmp_path):
    script = SUPPORT / "namespace_script.py"
    proc = Zygote.run([str(script), str(tmp_path), "--strategy", "delayed_averaging", "--iterable"], clean_env(PYTHONWARNINGS="ignore"),
                      tmp_path, 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
