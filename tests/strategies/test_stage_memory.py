"""Pipeline stages that hold only their part: a model built in configure_model() or __init__, each
rank materialising or keeping its own stage, the plan's memory checked and measured, full
checkpoints gathered stage by stage (tests/support/stage_memory_script.py, real gloo processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import SUPPORT, run_script
from stage_memory_script import BlockStack

SCRIPT = SUPPORT / "stage_memory_script.py"
pytestmark = pytest.mark.multiprocess


def run(out: Path, *args: str, check: bool = True):
    return run_script(SCRIPT, out, "--fork-ranks", *args, timeout=300, check=check)


def result(out: Path) -> dict:
    return torch.load(out / "result.pt", weights_only=False)


def assert_states_close(got: dict, want: dict, atol: float = 1e-5) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=atol, msg=name)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("one_process")
    run_script(SCRIPT, out, "--stages", "0", "--epochs", "2")
    return result(out)


@pytest.mark.parametrize("build", ["configure", "init"])
def test_each_rank_holds_its_stage_and_trains_as_one_process(tmp_path, one_process, build):
    """4 blocks of Linear(64, 64) on 2 stages: rank r holds blocks 2r, 2r+1 (the others on the meta
    device), and after 2 epochs of SGD with momentum the whole model equals one process's."""
    run(tmp_path, "--stages", "2", "--build", build, "--epochs", "2")
    got = result(tmp_path)
    assert_states_close(got["state"], one_process["state"])
    stage_bytes = 2 * (64 * 64 + 64) * 4
    assert [(real, freed) for real, freed, _, _ in got["ranks"]] == [(stage_bytes, stage_bytes)] * 2
    assert got["losses"] == pytest.approx(one_process["losses"], abs=1e-6)


def test_a_module_built_in_init_planned_at_the_first_batch_frees_the_other_stages(tmp_path, one_process):
    run(tmp_path, "--stages", "2", "--build", "init", "--no-input-shape", "--epochs", "2")
    got = result(tmp_path)
    assert_states_close(got["state"], one_process["state"])
    assert all(freed == real for real, freed, _, _ in got["ranks"])


def test_a_checkpoint_holds_the_whole_model_loads_into_one_device_and_resumes_the_pipeline(tmp_path, one_process):
    """Three stages: each tensor goes from the rank that holds it to rank 0 alone (the third rank takes no part)."""
    run(tmp_path / "first", "--stages", "3", "--build", "configure", "--epochs", "1", "--checkpoint")
    checkpoint = torch.load(tmp_path / "first" / "ckpt" / "last.ckpt", weights_only=True)
    single = BlockStack(64, 4, "init")
    single.load_state_dict(checkpoint["state_dict"])  # strict: every stage's tensors are there
    assert_states_close({k: v for k, v in single.state_dict().items()}, result(tmp_path / "first")["state"], atol=0)
    momentum = checkpoint["optimizer_states"][0]["state"]
    assert sorted(momentum) == list(range(8)) and all(s["momentum_buffer"].abs().sum() > 0 for s in momentum.values())
    run(tmp_path / "resumed", "--stages", "3", "--build", "configure", "--epochs", "2",
        "--resume", str(tmp_path / "first" / "ckpt" / "last.ckpt"))
    assert_states_close(result(tmp_path / "resumed")["state"], one_process["state"])


@pytest.mark.parametrize("stages", [2, 4])
def test_a_model_four_times_what_a_rank_may_hold_trains_within_its_stages_share(tmp_path, stages):
    """4 blocks of Linear(4096, 4096): 256 MiB of parameters, 768 MiB with gradients and momentum.
    Each rank holds only its stage, and its peak resident memory above the start stays within 1.3x
    the plan's estimate of its stage (parameters, gradients, momentum, activations, the gradient
    workspace): with 4 stages about 280 MiB a rank, where one process would need 768 MiB."""
    run(tmp_path, "--stages", str(stages), "--width", "4096", "--steps", "2", "--build", "configure")
    ranks = result(tmp_path)["ranks"]
    stage_params = 4 // stages * (4096 * 4096 + 4096) * 4
    for rank, (real, freed, peak, estimate) in enumerate(ranks):
        assert real == stage_params and freed == 4 * (4096 * 4096 + 4096) * 4 - stage_params, rank
        assert estimate >= 3 * stage_params, rank
        assert peak <= 1.3 * estimate, f"rank {rank}: peak {peak / 2**20:.0f} MiB, estimate {estimate / 2**20:.0f} MiB"


def test_stages_that_do_not_fit_their_devices_are_refused_naming_them(tmp_path):
    """With 300 MB a device, 2 stages of this model (448 MiB each) are refused before training, each
    stage named with its need and the shortfall; 4 stages (256 MiB each) train."""
    proc = run(tmp_path / "two", "--stages", "2", "--width", "4096", "--steps", "1", "--memory", "300MB", check=False)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "stage 0: blocks block0..block1 need 448.2 MiB" in output and "short by 162.1 MiB" in output, output[-3000:]
    assert not (tmp_path / "two" / "result.pt").exists()
    run(tmp_path / "four", "--stages", "4", "--width", "4096", "--steps", "1", "--memory", "300MB")
    assert (tmp_path / "four" / "result.pt").exists()
