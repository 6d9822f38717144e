"""Every strategy end to end on CUDA, and the CPU suite's equalities repeated there.

Run on a GPU machine with ``python -m pytest -m gpu tests/gpu`` (record the run in the README's
"Tested on" table). Without CUDA every test here is skipped, saying so. One GPU runs each strategy
with its processes sharing the card (the workers' group then uses gloo, chosen by the strategy);
tests that need a GPU per process skip on fewer GPUs.

Equalities across different batch layouts (two processes with batch 16 against one with batch 32)
hold to float32 rounding; on CUDA different batch sizes pick different kernels, so those compare at
rtol 1e-4 where the CPU suite uses 1e-5.
"""

from __future__ import annotations

import json
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
from conftest import REAL_MNIST, SUPPORT, run_script, run_train_script  # noqa: E402

# On GPUs the ranks are started as users start them by default (each runs the script anew): a fork
# must not follow CUDA's initialization, and this is the path the GPU checks are for.
run_train_script = partial(run_train_script, fork_ranks=False)
run_script = partial(run_script, timeout=300, fork_ranks=False)

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.multiprocess,
    pytest.mark.skipif(GPUS == 0, reason="no CUDA device on this machine: the GPU tests need one (run them on a GPU machine)"),
]
two_gpus = pytest.mark.skipif(GPUS < 2, reason=f"needs 2 GPUs, this machine has {GPUS}")
GPU = ["--accelerator", "gpu"]
SHARED = [*GPU, "--devices", "1", "--processes-per-device", "2"]  # two processes on one GPU
CROSS = dict(rtol=1e-4, atol=1e-5)


def load(path: Path) -> dict:
    return torch.load(path, weights_only=False)


def assert_params_equal(got: dict, want: dict, **tol) -> None:
    for name in want:
        torch.testing.assert_close(got[name].cpu(), want[name].cpu(), msg=name, **tol)


@pytest.fixture(scope="module")
def single_process_reference(tmp_path_factory) -> dict:
    """One process on the GPU with the global batch (32): what two workers of batch 16 must end with."""
    out = tmp_path_factory.mktemp("single")
    run_train_script(out, "--strategy", "auto", *GPU, "--devices", "1", "--batch-size", "32")
    return load(out / "rank0.pt")


def test_ssp_staleness_zero_with_two_workers_on_one_gpu_equals_one_process(tmp_path, single_process_reference):
    run_train_script(tmp_path, "--strategy", "ssp", "--staleness", "0", *SHARED, "--batch-size", "16")
    workers = [load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert_params_equal(workers[0], workers[1], rtol=0, atol=0)
    assert_params_equal(workers[0], single_process_reference, **CROSS)


@pytest.mark.parametrize("servers", ["1", "2"])
def test_ssp_staleness_zero_with_the_server_on_the_gpu_equals_one_process(tmp_path, single_process_reference, servers):
    """``server_device="cuda"``: the parameters and the optimizer on the GPU, one server or two shards."""
    run_train_script(tmp_path, "--strategy", "ssp", "--staleness", "0", *SHARED, "--batch-size", "16",
                     "--server-device", "cuda", "--servers", servers)
    workers = [load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert_params_equal(workers[0], workers[1], rtol=0, atol=0)
    assert_params_equal(workers[0], single_process_reference, **CROSS)


def test_delayed_averaging_strategy_delay_zero_with_two_processes_on_one_gpu_equals_one_process(tmp_path, single_process_reference):
    run_train_script(tmp_path, "--strategy", "asgd", "--delay", "0", *SHARED, "--batch-size", "16")
    assert_params_equal(load(tmp_path / "rank0.pt"), single_process_reference, **CROSS)


def test_balanced_with_unequal_shares_on_one_gpu_equals_one_process(tmp_path, single_process_reference):
    """Shares 8 and 24 of the global batch 32, rebalanced from measured speeds mid-epoch (rank 1 slowed)."""
    run_train_script(tmp_path, "--strategy", "balanced", "--speeds", "1,3", "--measure-steps", "2", "--rebalance-every",
                     "3", "--slowdown", "1,3", *SHARED, "--batch-size", "16")
    assert_params_equal(load(tmp_path / "rank0.pt"), single_process_reference, **CROSS)
    assert json.loads((tmp_path / "balanced.json").read_text())["history"][-1]["speed"][1] > 0


@pytest.mark.parametrize("variant", [["--staleness", "3", "--sync", "delay"], ["--staleness", "2", "--sync", "bounded"],
                                     ["--staleness", "inf"]], ids=["ssp", "ssp_bounded", "ssp_async"])
def test_ssp_variants_train_on_one_gpu(tmp_path, variant):
    run_train_script(tmp_path, "--strategy", "ssp", *variant, *SHARED, "--slowdown", "1,2")
    assert float((tmp_path / "test_acc.txt").read_text()) > 0.9


@pytest.mark.parametrize("strategy", [["--strategy", "cneural", "--lr", "1.0", "--epochs", "8"],
                                      ["--strategy", "asgd", "--delay", "1"]], ids=["cneural", "delayed_averaging"])
def test_one_process_on_one_gpu(tmp_path, strategy):
    """The reported failure: cNeural with one GPU worker ended after its first epoch."""
    run_train_script(tmp_path, *strategy, *GPU, "--devices", "1")
    assert float((tmp_path / "test_acc.txt").read_text()) > 0.5


@pytest.mark.parametrize("strategy", [["--strategy", "ssp", "--staleness", "2"], ["--strategy", "cneural", "--lr", "1.0"],
                                      ["--strategy", "asgd", "--delay", "1"], ["--strategy", "asgd", "--delay", "2", "--adam",
                                                                               "--lr", "0.01"],
                                      ["--strategy", "balanced", "--speeds", "1,3"],
                                      ["--strategy", "local_sgd", "--sync-every", "4", "--delay", "1"]],
                         ids=["ssp", "cneural", "delayed_averaging", "delayed_averaging_adam", "balanced", "local_sgd"])
def test_bf16_mixed(tmp_path, strategy):
    run_train_script(tmp_path, *strategy, *SHARED, "--precision", "bf16-mixed", "--epochs", "2")
    assert json.loads((tmp_path / "summary.json").read_text())["val_acc"] > 0.5


@two_gpus
def test_ssp_staleness_zero_on_two_gpus_equals_ddp(tmp_path):
    common = [*GPU, "--devices", "2", "--batch-size", "16"]
    run_train_script(tmp_path / "ddp", "--strategy", "ddp", *common)
    run_train_script(tmp_path / "ssp", "--strategy", "ssp", "--staleness", "0", *common)
    run_train_script(tmp_path / "asgd", "--strategy", "asgd", "--delay", "0", *common)
    ddp = load(tmp_path / "ddp" / "rank0.pt")
    assert_params_equal(load(tmp_path / "ssp" / "rank0.pt"), ddp, rtol=1e-5, atol=1e-6)
    assert_params_equal(load(tmp_path / "asgd" / "rank0.pt"), ddp, rtol=1e-5, atol=1e-6)


@two_gpus
def test_balanced_on_two_gpus_over_nccl_equals_one_process(tmp_path, single_process_reference):
    run_train_script(tmp_path, "--strategy", "balanced", "--speeds", "1,3", "--measure-steps", "2", "--rebalance-every",
                     "3", "--slowdown", "1,3", *GPU, "--devices", "2", "--batch-size", "16")
    assert_params_equal(load(tmp_path / "rank0.pt"), single_process_reference, **CROSS)


# ---------------------------------------------------------------------- pipeline and partitioned inference
HYBRID = SUPPORT / "hybrid_script.py"
PARTITION = SUPPORT / "partition_script.py"


def test_pipeline_on_one_gpu_equals_one_device(tmp_path):
    from hybrid_reference import assert_state_equal, reference_steps

    run_script(HYBRID, tmp_path, "--stages", "1", "--speeds", "1", "--samples", "32", "--batch", "32", "--epochs", "2", "--momentum", "0.9",
               *GPU)
    _, _, reference = reference_steps(32, 2, momentum=0.9)
    assert_state_equal(reference, {k: v.cpu() for k, v in load(tmp_path / "result.pt")["state"].items()})


def test_pipeline_bf16_mixed_on_one_gpu(tmp_path):
    run_script(HYBRID, tmp_path, "--stages", "1", "--speeds", "1", "--samples", "32", "--batch", "32", "--precision", "bf16-mixed", *GPU)
    assert torch.isfinite(torch.cat([v.flatten().float() for v in load(tmp_path / "result.pt")["state"].values()])).all()


def test_two_pipeline_stages_sharing_one_gpu_equal_one_device(tmp_path):
    from hybrid_reference import assert_state_equal, reference_steps

    run_script(HYBRID, tmp_path, "--stages", "2", "--samples", "32", "--batch", "32", "--epochs", "2", "--momentum", "0.9",
               *GPU, "--processes-per-device", "2")
    _, _, reference = reference_steps(32, 2, momentum=0.9)
    assert_state_equal(reference, {k: v.cpu() for k, v in load(tmp_path / "result.pt")["state"].items()})


@two_gpus
def test_two_pipeline_stages_on_two_gpus_equal_one_device(tmp_path):
    from hybrid_reference import assert_state_equal, reference_steps

    run_script(HYBRID, tmp_path, "--stages", "2", "--samples", "32", "--batch", "32", "--epochs", "2", "--momentum", "0.9",
               *GPU)
    _, _, reference = reference_steps(32, 2, momentum=0.9)
    assert_state_equal(reference, {k: v.cpu() for k, v in load(tmp_path / "result.pt")["state"].items()})


def test_partitioned_inference_on_one_gpu_equals_the_plain_model(tmp_path):
    run_script(PARTITION, tmp_path, "--models", "lenet", "vgg", "--abilities", "1,2", *GPU, "--processes-per-device", "2")
    for name in ("lenet", "vgg"):
        for rank in (0, 1):
            saved = load(tmp_path / f"{name}_rank{rank}.pt")
            torch.testing.assert_close(saved["logits"], saved["reference"], rtol=1e-4, atol=1e-4)


@two_gpus
def test_partitioned_inference_on_two_gpus_equals_the_plain_model(tmp_path):
    run_script(PARTITION, tmp_path, "--models", "lenet", "--abilities", "1,2", *GPU)
    for rank in (0, 1):
        saved = load(tmp_path / f"lenet_rank{rank}.pt")
        torch.testing.assert_close(saved["logits"], saved["reference"], rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------- faults and the command line
def test_out_of_memory_on_one_worker_ends_the_run_on_every_rank(tmp_path):
    start = time.perf_counter()
    proc = run_train_script(tmp_path, "--strategy", "ssp", *SHARED, "--oom-rank", "1", "--oom-step", "3",
                            "--timeout", "60", check=False, timeout=180)
    assert proc.returncode != 0
    assert "out of memory" in proc.stderr.lower(), proc.stderr[-3000:]
    assert time.perf_counter() - start < 150


needs_mnist = pytest.mark.skipif(not (REAL_MNIST / "train-images-idx3-ubyte.gz").is_file(),
                                 reason=f"real MNIST not found in {REAL_MNIST}")


# cNeural takes one full-batch step per pass (epoch): one pass of MNIST leaves the network at chance, so
# it gets 15 short passes (8 batches each) at Adam's rate, which reach about 0.85 on the CPU.
CNEURAL_PASSES = ["trainer.max_epochs=15", "trainer.limit_train_batches=8", "trainer.limit_val_batches=2",
                  "optimizer=adam", "optimizer.lr=0.01"]


@needs_mnist
@pytest.mark.parametrize("overrides", [["strategy=cneural", "trainer.devices=1", *CNEURAL_PASSES],
                                       ["strategy=ssp_delay", "trainer.devices=2", "trainer.max_epochs=1"]],
                         ids=["cneural_one_gpu", "ssp_two_workers_one_gpu"])
def test_the_command_line_trains_and_tests_on_a_gpu(tmp_path, overrides):
    from conftest import run_cli

    proc = run_cli(*overrides, "trainer=gpu", f"data.root={REAL_MNIST}", cwd=tmp_path, timeout=600)
    (metrics,) = tmp_path.glob("outputs/runs/*/metrics.json")
    assert json.loads(metrics.read_text())["test/acc"] > 0.5, proc.stdout[-2000:]


def test_adni_volumes_are_held_on_the_gpu_by_default_and_train(tmp_path):
    """``cache="auto"`` on CUDA: the preprocessed volumes stacked on the GPU, batches gathered there."""
    import pytorch_lightning as pl

    from lightning_hybrid import ClassifierModule
    from lightning_hybrid.data import ADNIDataModule
    from lightning_hybrid.data.adni_phantoms import write_adni_phantoms
    from lightning_hybrid.models import ResAttNet3D

    csv_path = write_adni_phantoms(tmp_path, subjects=16, shape=(40, 44, 40), seed=0)
    dm = ADNIDataModule({"csv_path": csv_path}, view={"image_shape": (32, 32, 32)}, batch_size=4)
    module = ClassifierModule(ResAttNet3D(depth=18, base_channels=8))
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=dm)
    assert dm.device_cache is not None and dm.device_cache.type == "cuda"
    images, labels = next(iter(dm.train_dataloader()))
    assert images.is_cuda and labels.is_cuda
    (result,) = trainer.test(module, datamodule=dm, verbose=False)
    assert 0.0 <= result["test/bacc"] <= 1.0


def test_pipeline_stages_sharing_one_gpu_hold_only_their_part(tmp_path):
    """4 blocks of Linear(4096, 4096) built in configure_model(), 2 stages on one GPU: each process
    materialises only its 2 blocks, and its peak CUDA allocation (max_memory_allocated above the start)
    stays within 1.3x the plan's estimate of its stage."""
    run_script(SUPPORT / "stage_memory_script.py", tmp_path, "--stages", "2", "--width", "4096", "--steps", "2",
               "--accelerator", "gpu", "--processes-per-device", "2")
    ranks = load(tmp_path / "result.pt")["ranks"]
    for rank, (real, freed, peak, estimate) in enumerate(ranks):
        assert real == freed == 2 * (4096 * 4096 + 4096) * 4, rank
        assert 0 < peak <= 1.3 * estimate, f"rank {rank}: peak {peak / 2**20:.0f} MiB, estimate {estimate / 2**20:.0f} MiB"


# ---------------------------------------------------------------------- preemption and the straggler report
#: The CPU suite's preemption runs (tests/test_preemption.py) with two processes sharing the GPU, each rank
#: started anew (no fork after CUDA's initialization): SSP with its server, balanced's shares and the
#: pipeline's stages gathered to rank 0 are the state a CUDA stop must carry.
GPU_STOPS = {
    "ssp": ("strategy=ssp_delay", "strategy.staleness=0"),
    "balanced": ("strategy=balanced",),
    "hybrid": ("strategy=hybrid", "strategy.placement=uniform"),
}
STOP_ACCELERATOR = "gpu"


@pytest.mark.parametrize("strategy", list(GPU_STOPS))
def test_sigterm_on_a_gpu_stops_and_the_same_command_resumes_to_the_uninterrupted_result(tmp_path, strategy):
    from preemption_runs import callbacks, last_line, run

    # Deterministic kernels: without them cuDNN's weight gradients differ run to run (on an H200 the
    # resumed and the uninterrupted runs' first conv weights ended about 1e-4 apart under each strategy).
    settings = (*GPU_STOPS[strategy], f"trainer.accelerator={STOP_ACCELERATOR}", "trainer.devices=2",
                "trainer.deterministic=true")
    interrupted = (*settings, f"hydra.run.dir={tmp_path / 'run'}", *callbacks(tmp_path, "resumed", epoch=2, batch=1))
    stopped = run(*interrupted, cwd=tmp_path, timeout=300)
    assert stopped.returncode == 143, (stopped.stdout + stopped.stderr)[-4000:]
    assert "stopped by SIGTERM in epoch 2" in last_line(stopped), last_line(stopped)
    resumed = run(*interrupted, cwd=tmp_path, timeout=300)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-4000:]
    reference = run(*settings, f"hydra.run.dir={tmp_path / 'reference'}", *callbacks(tmp_path, "reference"),
                    cwd=tmp_path, timeout=300)
    assert reference.returncode == 0, (reference.stdout + reference.stderr)[-4000:]
    assert_params_equal(load(tmp_path / "resumed.pt"), load(tmp_path / "reference.pt"), rtol=0, atol=1e-5)


def test_the_straggler_report_names_a_slow_worker_sharing_the_gpu(tmp_path):
    """SSP's two workers on one GPU, one slowed by 0.3 s a step in a callback (0.1 s of compute each):
    the report names it, persistent, at about 4x."""
    run_train_script(tmp_path, "--strategy", "ssp", *SHARED, "--samples", "256", "--batch-size", "16", "--epochs", "2",
                     "--compute-sleep", "0.1", "--straggler-report", "--slow-rank", "1", "--slow-by", "callback",
                     "--slow-per-sample", str(0.3 / 16))
    findings = json.loads((tmp_path / "straggler.json").read_text())
    assert len(findings) == 2
    for f in findings:
        assert f["slow_rank"] == 1 and f["pattern"] == "persistent" and 3.2 <= f["factor"] <= 4.8, findings
