"""The `lightning-hybrid` command end to end, in real subprocesses (DDP ranks included)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from conftest import run_cli

SMOKE = ("experiment=smoke",)


def read_metrics(run_dir: Path) -> dict[str, float]:
    return json.loads((run_dir / "metrics.json").read_text())


def test_single_process_run_reports_metrics_and_outputs(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(*SMOKE, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    metrics = read_metrics(run_dir)
    assert {"test/acc", "test/loss", "val/acc", "train/loss", "time/epoch_s"} <= set(metrics)
    log = proc.stdout + proc.stderr
    assert "final metrics" in log and f"outputs: {run_dir}" in log
    assert "SYNTHETIC" in log
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert (run_dir / ".hydra" / "config.yaml").is_file()


def test_resume_from_checkpoint(tmp_path):
    first = tmp_path / "first"
    run_cli(*SMOKE, f"hydra.run.dir={first}", "test=false", cwd=tmp_path)
    second = tmp_path / "second"
    run_cli(*SMOKE, f"hydra.run.dir={second}", "trainer.max_epochs=2", f"ckpt_path={first}/checkpoints/last.ckpt", cwd=tmp_path)
    with open(next(second.glob("csv/*/metrics.csv"))) as f:
        epochs = {row["epoch"] for row in csv.DictReader(f) if row.get("time/epoch_s")}
    assert epochs == {"1"}, "the resumed run must train only the epoch the first run had not done"


@pytest.mark.multiprocess
def test_ssp_through_the_cli(tmp_path):
    run_dir = tmp_path / "ssp"
    run_cli(
        *SMOKE, "strategy=ssp_delay", "strategy.staleness=2", "strategy.sync=bounded", "strategy.fork_ranks=true", "trainer.devices=2", "trainer.max_epochs=2",
        "allow_cpu_oversubscription=true", f"hydra.run.dir={run_dir}", cwd=tmp_path,
    )
    metrics = read_metrics(run_dir)
    assert metrics["ssp/max_gap"] <= 2
    assert metrics["ssp/worker0/iterations"] + metrics["ssp/worker1/iterations"] == 8  # 512 samples / 64, pooled
    assert {"val/acc", "test/acc"} <= set(metrics)
    # the server's load, measured after its first step (2 pushes): 16 pushes, one step per 2 (the workers)
    assert (metrics["server/pushes"], metrics["server/steps"]) == (14, 7)
    assert 0 < metrics["server/busy_s"] <= metrics["server/wall_s"] and metrics["server/cpu_ms_per_push"] > 0
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.multiprocess
def test_delayed_averaging_strategy_through_the_cli(tmp_path):
    run_dir = tmp_path / "asgd"
    run_cli(
        *SMOKE, "strategy=delayed_averaging", "strategy.delay=2", "strategy.fork_ranks=true", "trainer.devices=2",
        "sim=slow_network", "sim.collective_latency_s=0.002", "allow_cpu_oversubscription=true",
        f"hydra.run.dir={run_dir}", cwd=tmp_path,
    )
    metrics = read_metrics(run_dir)
    assert {"asgd/compute_s", "asgd/wait_s", "asgd/bytes_sent", "val/acc", "test/acc"} <= set(metrics)


def test_collective_latency_needs_ranks_that_all_reduce(tmp_path):
    proc = run_cli(*SMOKE, "sim=slow_network", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path, check=False)
    assert proc.returncode != 0 and "trainer.devices=2" in proc.stderr and "one process" in proc.stderr


@pytest.mark.multiprocess
def test_multirun_sweep_with_ddp_runs_each_job_once(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli(
        "-m", *SMOKE, "strategy=ddp", "trainer.devices=2", "allow_cpu_oversubscription=true", "seed=1,2",
        f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=400,
    )
    assert sorted(p.name for p in sweep.iterdir()) == ["0", "1", "multirun.yaml", "summary.csv"]
    assert "2 jobs; test set:" in proc.stdout and "scan/acc" in proc.stdout  # the sweep's summary, a job per row
    for job, seed in (("0", 1), ("1", 2)):
        assert (sweep / job / "train_ddp_process_1.log").is_file()
        assert (sweep / job / "metrics.json").is_file()
        assert f"seed: {seed}" in (sweep / job / ".hydra" / "config.yaml").read_text()
    # ranks 1 must not have started sweeps (or runs) of their own anywhere else
    assert not (tmp_path / "outputs").exists()
    assert (proc.stdout + proc.stderr).count("Launching 2 jobs locally") == 1


def test_forked_ranks_are_refused_in_a_multirun(tmp_path):
    proc = run_cli("-m", *SMOKE, "strategy=ssp_delay", "strategy.fork_ranks=true", "trainer.devices=2",
                   "allow_cpu_oversubscription=true", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "strategy.fork_ranks=true cannot be used in a multirun" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.multiprocess
def test_sim_slowdown_slows_ddp(tmp_path):
    def epoch_time(*overrides):
        run_dir = tmp_path / str(len(list(tmp_path.iterdir())))
        run_cli(
            "data=synthetic", "data.num_train=4096", "data.batch_size=128", "trainer=debug", "trainer.limit_train_batches=16",
            "trainer.max_epochs=2", "strategy=ddp", "trainer.devices=2", "allow_cpu_oversubscription=true", "test=false",
            f"hydra.run.dir={run_dir}", *overrides, cwd=tmp_path,
        )
        with open(next(run_dir.glob("csv/*/metrics.csv"))) as f:
            return [float(r["time/epoch_s"]) for r in csv.DictReader(f) if r.get("time/epoch_s")][-1]

    base = epoch_time()
    slowed = epoch_time("sim.slowdown=[1.0,3.0]")
    # Synchronous DDP runs at the pace of its slowest rank, which sleeps twice its CPU time per step: 3x
    # on an idle machine, less where other processes stretch the wall-clock time of both runs' steps.
    assert 1.3 < slowed / base < 4.5, (base, slowed)


def test_unknown_key_and_option(tmp_path):
    proc = run_cli("trainer.not_a_knob=1", cwd=tmp_path, check=False)
    assert proc.returncode != 0 and "not_a_knob" in proc.stderr
    proc = run_cli("model=resnet9000", cwd=tmp_path, check=False)
    assert proc.returncode != 0 and "model/resnet9000" in proc.stderr and "lenet5" in proc.stderr


def test_too_many_cpu_devices(tmp_path):
    too_many = (os.cpu_count() or 1) + 1
    proc = run_cli(*SMOKE, "strategy=ddp", f"trainer.devices={too_many}", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert f"trainer.devices={too_many}" in proc.stderr and "allow_cpu_oversubscription=true" in proc.stderr
    assert not (tmp_path / "r" / "train_ddp_process_1.log").exists(), "refused before any process started"


def test_slowdown_length_mismatch_fails_before_launch(tmp_path):
    proc = run_cli(*SMOKE, "sim.slowdown=[1.0,2.0,3.0]", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path, check=False)
    assert proc.returncode != 0 and "3 factors" in proc.stderr and "1 training ranks" in proc.stderr


def test_offline_mnist_error(tmp_path):
    proc = run_cli(
        f"data.root={tmp_path / 'nothing'}", "data.mirrors=[http://127.0.0.1:9/]", f"hydra.run.dir={tmp_path / 'r'}",
        cwd=tmp_path, check=False,
    )
    assert proc.returncode != 0
    assert "train-images-idx3-ubyte.gz" in proc.stderr and "t10k-labels-idx1-ubyte.gz" in proc.stderr
    assert "data=synthetic" in proc.stderr and str(tmp_path / "nothing") in proc.stderr


def test_real_mnist_lenet5(real_mnist, tmp_path):
    run_dir = tmp_path / "mnist"
    run_cli(
        f"data.root={real_mnist}", "data.subset=6000", "trainer.max_epochs=2", "trainer.accelerator=cpu",
        f"hydra.run.dir={run_dir}", cwd=tmp_path,
    )
    # LeNet-5 on 5.5k real training digits for two epochs; the full set gives ~0.99 (README).
    assert read_metrics(run_dir)["test/acc"] > 0.9


def test_plan_command_prints_every_method(capsys):
    from lightning_hybrid.cli.plan_command import plan_command

    text = plan_command(["model=lenet5", "devices=[1,2,{speed: 1, memory: 1GiB}]", "batch=2", "stages=2"])
    for method in ("gabra", "exact", "uniform", "parameters", "time"):
        assert f"| {method} |" in text
    assert "LeNet5: 7 blocks" in text
    with pytest.raises(SystemExit, match="unknown argument"):
        plan_command(["devics=[1,2]"])


def test_plan_draws_the_placements_and_the_pipeline_timeline(tmp_path):
    pytest.importorskip("matplotlib", reason="the figure needs matplotlib (the plots extra)")
    import matplotlib.image

    from lightning_hybrid.cli.plan_command import plan_command

    path = tmp_path / "plan.png"
    text = plan_command(["model=lenet5", "devices=[1,2]", "batch=2", f"figure={path}"])
    assert f"figure: {path}" in text
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 200 and image.shape[1] > 800


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_the_timeline_of_equal_stages_takes_the_pipeline_bound(schedule):
    """Equal stages, ``m`` micro-batches on ``s`` stages: (m + s - 1) forward and (m + s - 1) backward
    slots, for GPipe and 1F1B alike; every action once; a stage never runs two at a time."""
    from lightning_hybrid.placement.figure import timeline

    stages, micro_batches = 3, 4
    runs = timeline([12.0] * stages, micro_batches, schedule)  # per micro-batch: forward 1 s, backward 2 s
    assert max(end for stage in runs for _, _, end in stage) == pytest.approx((micro_batches + stages - 1) * (1 + 2))
    for stage in runs:
        assert sorted(str(a) for a, _, _ in stage) == sorted([f"F{m}" for m in range(4)] + [f"B{m}" for m in range(4)])
        assert all(end <= next_start + 1e-9 for (_, _, end), (_, next_start, _) in zip(stage, stage[1:]))
    two_steps = timeline([12.0] * stages, micro_batches, schedule, steps=2)
    assert len(two_steps[0]) == 2 * 2 * micro_batches


def test_partitioned_inference_tests_a_trained_checkpoint_through_the_cli(tmp_path):
    """fit=false + ckpt_path: the test set through two ranks of unequal ability gives the single-process
    test metrics."""
    trained, partitioned = tmp_path / "trained", tmp_path / "partitioned"
    run_cli(*SMOKE, f"hydra.run.dir={trained}", cwd=tmp_path)
    run_cli(
        *SMOKE, "strategy=partitioned_inference", "strategy.abilities=[1,2]", "strategy.fork_ranks=true", "trainer.devices=2", "fit=false",
        f"ckpt_path={trained}/checkpoints/last.ckpt", f"hydra.run.dir={partitioned}", cwd=tmp_path,
    )
    single, split = read_metrics(trained), read_metrics(partitioned)
    assert split["test/acc"] == pytest.approx(single["test/acc"], abs=1e-6)
    assert split["test/loss"] == pytest.approx(single["test/loss"], rel=1e-5)


def test_more_processes_than_gpus_share_them_when_the_strategy_can():
    from omegaconf import OmegaConf

    from lightning_hybrid.cli.app import spread_processes_over_gpus

    def cfg(devices, strategy):
        return OmegaConf.create({"trainer": {"accelerator": "gpu", "devices": devices}, "strategy": strategy})

    shared = cfg(4, {"_target_": "lightning_hybrid.SSPStrategy", "processes_per_device": 1})
    spread_processes_over_gpus(shared, gpus=2)
    assert shared.trainer.devices == 2 and shared.strategy.processes_per_device == 2
    one_each = cfg(2, {"_target_": "lightning_hybrid.SSPStrategy", "processes_per_device": 1})
    spread_processes_over_gpus(one_each, gpus=2)
    assert one_each.trainer.devices == 2 and one_each.strategy.processes_per_device == 1
    ddp = cfg(2, {"_target_": "pytorch_lightning.strategies.DDPStrategy"})
    spread_processes_over_gpus(ddp, gpus=1)  # Lightning's DDP cannot share a GPU: its own error will say so
    assert ddp.trainer.devices == 2
    with pytest.raises(ValueError, match="cannot be spread evenly over this machine's 2 GPUs"):
        spread_processes_over_gpus(cfg(3, {"processes_per_device": 1}), gpus=2)
    with pytest.raises(ValueError, match="no CUDA device.*set trainer=cpu"):
        spread_processes_over_gpus(cfg(1, {"processes_per_device": 1}), gpus=0)


def test_progress_is_lines_when_the_output_is_not_a_terminal():
    import io

    from omegaconf import OmegaConf

    from lightning_hybrid.cli.app import progress_as_lines

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    cfg = lambda **kw: OmegaConf.create({"trainer": {"enable_progress_bar": True}, **kw})  # noqa: E731
    assert progress_as_lines(cfg(progress="auto"), io.StringIO())
    assert not progress_as_lines(cfg(progress="auto"), Terminal())
    assert progress_as_lines(cfg(progress="log"), Terminal()) and not progress_as_lines(cfg(progress="bar"), io.StringIO())
    assert not progress_as_lines(OmegaConf.create({"trainer": {"enable_progress_bar": False}, "progress": "log"}))
    with pytest.raises(ValueError, match="progress=bar"):
        progress_as_lines(cfg(progress="tqdm"))


@pytest.mark.multiprocess
def test_a_data_error_is_the_last_thing_printed(tmp_path):
    """Offline with no MNIST, two SSP workers: the clear error ends the output, no peer's traceback after it."""
    proc = run_cli(
        "strategy=ssp_delay", "trainer.devices=2", "allow_cpu_oversubscription=true", f"data.root={tmp_path / 'nothing'}",
        "data.mirrors=[http://127.0.0.1:9/]", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path, check=False,
    )
    assert proc.returncode != 0
    tail = proc.stderr[proc.stderr.rindex("train-images-idx3-ubyte.gz"):]
    assert "data=synthetic" in tail
    for noise in ("Traceback", "gloo", "Connection", "[rank: 1]", "Child process"):
        assert noise not in tail, proc.stderr[-3000:]


def test_data_adni_keys_from_before_the_grouping_are_refused_saying_where_they_went(monkeypatch, capsys):
    """``data.image_shape=...`` (a key of data=adni before its settings were grouped) stops before Hydra
    starts, naming the override to type instead; grouped keys and other datamodules' keys pass."""
    from lightning_hybrid.cli import command

    assert command.moved_overrides(["data=adni_caps", "data.view.image_shape=[8,8,8]", "data.split.fold=2",
                                    "data.root=/data/mnist", "data.batch_size=4", "data.cache.where=memory"]) == []
    monkeypatch.setattr("sys.argv", ["lightning-hybrid", "data=adni_caps", "data.image_shape=[8,8,8]", "data.split=2",
                                     "data.cache=memory", "data.augment=false", "+data.cache_dir=/tmp/c"])
    monkeypatch.setattr(command, "_hydra_train", lambda: pytest.fail("Hydra started despite the moved keys"))
    with pytest.raises(SystemExit) as stopped:
        command.main()
    message = str(stopped.value.code)
    for hint in ("data.image_shape=[8,8,8] -> data.view.image_shape=[8,8,8]", "data.split=2 -> data.split.fold=2",
                 "data.cache=memory -> data.cache.where=memory", "data.augment=false -> data.augment.where=null",
                 "+data.cache_dir=/tmp/c -> data.cache.dir=/tmp/c"):
        assert hint in message, message


def test_errors_a_user_can_cause_end_in_one_message_without_a_traceback(tmp_path):
    """Each ends the command with exit status 1 and one message naming what to change: an unreadable checkpoint
    in the run folder, a run folder of another configuration, a model that cannot take the data's samples, an
    optimizer setting torch refuses, MNIST missing where data.root points (offline here: the download fails)."""
    run = tmp_path / "run"
    first = (*SMOKE, "trainer.limit_train_batches=2", "test=false")
    run_cli(*first, f"hydra.run.dir={run}", cwd=tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    last.write_bytes(os.urandom(5000))  # 5 kB of noise where the checkpoint was
    cases = {
        "unreadable": ((*first, f"hydra.run.dir={run}"), ["last.ckpt is unreadable", "ckpt_path=null", "epoch000.ckpt"]),
        "another configuration": ((*first, "model=mlp", f"hydra.run.dir={run}"), ["of another configuration", "ckpt_path=null"]),
        "model and data": ((*SMOKE, "model=resattnet3d_18", f"hydra.run.dir={tmp_path / 'm'}"),
                           ["model=resattnet3d_18 takes volumes", "data=synthetic gives samples of shape [1, 28, 28]"]),
        "optimizer": ((*SMOKE, "optimizer.lr=-1", f"hydra.run.dir={tmp_path / 'o'}"), ["optimizer.lr=-1: Invalid learning rate"]),
        "missing data": (("data.root=/nonexistent/mnist", f"hydra.run.dir={tmp_path / 'd'}"),
                         ["MNIST is not in /nonexistent/mnist", "data=synthetic"]),
    }
    for case, (overrides, said) in cases.items():
        proc = run_cli(*overrides, cwd=tmp_path, check=False)
        output = proc.stdout + proc.stderr
        assert proc.returncode == 1, f"{case}: exit status {proc.returncode}\n{output[-3000:]}"
        assert "Traceback" not in output and output.count("error: ") == 1, f"{case}:\n{output[-3000:]}"
        assert all(s in output for s in said), f"{case}: expected {said}\n{output[-3000:]}"


@pytest.mark.multiprocess
def test_powersgd_on_gloo_trains_a_model_of_several_buckets(tmp_path):
    """torch's PowerSGD hook starts its second and third all-reduces from a bucket's completion: on gloo,
    with several buckets, the ranks start them in different orders (a size mismatch or a hang). The
    strategy gives it one bucket there, says so, and the run trains past the compressed steps."""
    proc = run_cli("strategy=ddp_powersgd", "strategy.ddp_kwargs.ddp_comm_state.start_powerSGD_iter=2", "data=synthetic",
                   "data.num_train=1024", "data.num_val=64", "model=mlp", "model.hidden=[512,512]", "trainer.devices=2",
                   "trainer.max_epochs=1", "trainer.limit_train_batches=12", "trainer.limit_val_batches=1", "test=false",
                   "logger=csv", cwd=tmp_path, timeout=180)
    output = proc.stdout + proc.stderr
    assert "powerSGD_hook on gloo: one gradient bucket" in output, output[-3000:]
    rows = list(csv.DictReader(open(next(tmp_path.rglob("metrics.csv")))))
    assert any(r.get("train/loss_epoch") for r in rows), rows
