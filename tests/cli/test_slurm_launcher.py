"""SLURM through submitit: what `hydra/launcher=slurm` asks for (nodes, tasks, GPUs, cores with the
parameter server's processes), the sbatch script it makes, and a job of two tasks run end to end by
submitit's LocalExecutor (`hydra/launcher=slurm_local`), each task one Lightning rank."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from conftest import run_cli
from lightning_hybrid.cli.slurm import (
    AUTO_THREADS,
    TORCHRUN_VARIABLES,
    main_port,
    slurm_resources,
    submitit_task_as_rank,
    task_threads,
)

NEEDS_PLUGIN = "hydra-submitit-launcher is not installed (pip install 'lightning-hybrid[slurm]'); skipping"


def compose_cfg(*overrides: str, hydra: bool = False):
    GlobalHydra.instance().clear()
    with initialize_config_module("lightning_hybrid.configs", version_base="1.3", job_name="cli"):
        return compose("train", overrides=list(overrides), return_hydra_config=hydra)


def resources(*overrides: str) -> dict[str, int]:
    return slurm_resources(compose_cfg(*overrides))


CPU, GPU = AUTO_THREADS["cpu"], AUTO_THREADS["gpu"]


@pytest.mark.parametrize(
    "overrides, expected",
    [
        # one task per rank; no GPU unless trainer.accelerator is gpu (auto asks for none)
        (("strategy=ddp", "trainer.devices=2"), dict(nodes=1, tasks_per_node=2, gpus_per_node=0, cpus_per_task=CPU)),
        (("strategy=ddp", "trainer=gpu", "trainer.devices=4", "trainer.num_nodes=2"),
         dict(nodes=2, tasks_per_node=4, gpus_per_node=4, cpus_per_task=GPU)),
        (("strategy=single",), dict(nodes=1, tasks_per_node=1, gpus_per_node=0, cpus_per_task=CPU)),
        # a rank's cores: its threads and its loader workers
        (("strategy=delayed_averaging", "trainer=cpu", "trainer.devices=3", "cpu_threads_per_process=2", "data.num_workers=1"),
         dict(nodes=1, tasks_per_node=3, gpus_per_node=0, cpus_per_task=3)),
        # the parameter server: one more core per server process, in every task
        (("strategy=ssp_delay", "trainer.devices=2"), dict(nodes=1, tasks_per_node=2, gpus_per_node=0, cpus_per_task=CPU + 1)),
        (("strategy=ssp_delay", "trainer=gpu", "trainer.devices=4", "trainer.num_nodes=2"),
         dict(nodes=2, tasks_per_node=4, gpus_per_node=4, cpus_per_task=GPU + 1)),
        (("strategy=ssp_async", "trainer.devices=2", "strategy.servers=3"),
         dict(nodes=1, tasks_per_node=2, gpus_per_node=0, cpus_per_task=CPU + 3)),
        (("strategy=cneural", "trainer.devices=2", "cpu_threads_per_process=1"),
         dict(nodes=1, tasks_per_node=2, gpus_per_node=0, cpus_per_task=2)),
        # servers=auto on a model of 138 M parameters (counted on the meta device): two servers' cores
        (("strategy=ssp_delay", "trainer.devices=2", "model=vgg16"),
         dict(nodes=1, tasks_per_node=2, gpus_per_node=0, cpus_per_task=CPU + 2)),
        (("strategy=ssp_delay", "trainer.devices=2", "model=vgg16", "strategy.on_worker_failure=continue"),
         dict(nodes=1, tasks_per_node=2, gpus_per_node=0, cpus_per_task=CPU + 1)),
        # two processes on each GPU: two tasks per GPU
        (("strategy=ssp_delay", "trainer=gpu", "trainer.devices=1", "strategy.processes_per_device=2"),
         dict(nodes=1, tasks_per_node=2, gpus_per_node=1, cpus_per_task=GPU + 1)),
        # a pipeline: pipeline_stages x data_parallel ranks over the nodes
        (("strategy=hybrid", "trainer.devices=2"), dict(nodes=1, tasks_per_node=2, gpus_per_node=0, cpus_per_task=CPU)),
        (("strategy=hybrid", "strategy.data_parallel=2", "trainer=gpu", "trainer.devices=2", "trainer.num_nodes=2"),
         dict(nodes=2, tasks_per_node=2, gpus_per_node=2, cpus_per_task=GPU)),
    ],
    ids=["ddp-cpu", "ddp-gpu-2x4", "single", "threads-and-workers", "ssp-cpu", "ssp-gpu-2x4", "ssp-3-servers",
         "cneural", "ssp-auto-large-model", "ssp-continue-one-server", "ssp-2-per-gpu", "hybrid", "hybrid-2-nodes"],
)
def test_resources_of_each_strategy(overrides, expected):
    assert resources(*overrides) == expected


@pytest.mark.parametrize(
    "overrides, message",
    [
        (("strategy=hybrid", "trainer.devices=3"), "pipeline_stages x data_parallel"),
        (("strategy=ddp_spawn", "trainer.devices=2"), "start_method=spawn"),
        (("strategy=ssp_delay", "trainer.devices=2", "strategy.fork_ranks=true"), "fork_ranks"),
        (("strategy=ddp", "trainer.devices=auto"), "trainer.devices='auto'"),
    ],
)
def test_what_one_task_per_rank_cannot_run_is_refused_at_launch(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        resources(*overrides)


def test_the_resolver_reads_the_whole_config():
    cfg = compose_cfg("strategy=ssp_delay", "trainer.devices=2")
    node = OmegaConf.create({"cpus": "${lh_slurm:cpus_per_task}", "tasks": "${lh_slurm:tasks_per_node}"})
    OmegaConf.set_struct(cfg, False)
    cfg.probe = node
    assert (cfg.probe.cpus, cfg.probe.tasks) == (CPU + 1, 2)
    cfg.probe.bad = "${lh_slurm:cores}"
    with pytest.raises(Exception, match="choose one of nodes, tasks_per_node"):
        _ = cfg.probe.bad


def test_threads_in_a_slurm_task_leave_the_servers_their_cores():
    cfg = compose_cfg("strategy=ssp_delay", "trainer.devices=4", "strategy.servers=2")
    with mock.patch.dict(os.environ, {"SLURM_CPUS_PER_TASK": "6", "SLURM_NTASKS": "4"}):
        assert task_threads(cfg, global_rank=0) == 4  # 6 cores, 2 of them the servers'
        assert task_threads(cfg, global_rank=3) == 6
        cfg.cpu_threads_per_process = 3
        assert task_threads(cfg, global_rank=0) is None  # the user's number stands
    with mock.patch.dict(os.environ, clear=True):
        assert task_threads(compose_cfg("strategy=ssp_delay"), global_rank=0) is None  # not in SLURM


def test_the_cli_sets_a_slurm_task_s_threads_and_keeps_them_from_lightning(monkeypatch):
    import torch
    from pytorch_lightning.accelerators import CPUAccelerator

    from lightning_hybrid.cli.app import set_cpu_threads

    cfg = compose_cfg("strategy=ssp_delay", "trainer.devices=4", "strategy.servers=1")
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    with mock.patch.dict(os.environ, {"SLURM_CPUS_PER_TASK": "6", "SLURM_NTASKS": "4"}):
        set_cpu_threads(cfg, SimpleNamespace(accelerator=CPUAccelerator(), global_rank=0, num_devices=4))
        # not 6 // trainer.devices: Lightning's launcher leaves torch's threads alone with OMP_NUM_THREADS set
        assert calls == [5] and os.environ["OMP_NUM_THREADS"] == "5"


def submitit_local_env(**extra: str) -> dict[str, str]:
    """The variables submitit's LocalExecutor gives task 1 of a job of two tasks (and nothing of SLURM or torchrun)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_")) and k not in TORCHRUN_VARIABLES}
    env.update(SUBMITIT_EXECUTOR="local", SUBMITIT_LOCAL_JOB_ID="4321", SUBMITIT_LOCAL_NTASKS="2", SUBMITIT_LOCAL_NODEID="0",
               SUBMITIT_LOCAL_JOB_NUM_NODES="1", SUBMITIT_LOCAL_GLOBALID="1", SUBMITIT_LOCAL_LOCALID="1")
    return {**env, **extra}


def test_a_local_submitit_task_becomes_a_torchrun_rank():
    pytest.importorskip("submitit", reason=NEEDS_PLUGIN)
    from lightning_fabric.plugins.environments import TorchElasticEnvironment

    with mock.patch.dict(os.environ, submitit_local_env(), clear=True):
        assert submitit_task_as_rank()
        assert TorchElasticEnvironment.detect()
        env = TorchElasticEnvironment()
        assert (env.global_rank(), env.local_rank(), env.world_size(), env.node_rank()) == (1, 1, 2, 0)
        assert (env.main_address, env.main_port) == ("127.0.0.1", main_port("4321"))
        assert env.creates_processes_externally  # Lightning starts no rank of its own
    # not a submitit job, a job of one task, or a task SLURM (or torchrun) has already made a rank: nothing
    for env in ({k: v for k, v in submitit_local_env().items() if k != "SUBMITIT_EXECUTOR"},
                submitit_local_env(SUBMITIT_LOCAL_NTASKS="1"),
                submitit_local_env(SLURM_NTASKS="2", SLURM_JOB_NAME="cli"),
                submitit_local_env(TORCHELASTIC_RUN_ID="x", RANK="1")):
        with mock.patch.dict(os.environ, env, clear=True):
            assert not submitit_task_as_rank()
            assert "MASTER_PORT" not in os.environ and "LOCAL_WORLD_SIZE" not in os.environ


def test_every_task_of_a_job_agrees_on_the_port_and_jobs_differ():
    assert main_port("123") == main_port("123")
    assert 15000 <= main_port("123") < 25000
    assert len({main_port(str(job)) for job in range(100, 120)}) > 15


def slurm_launcher_params(tmp_path: Path, *overrides: str) -> dict:
    from hydra.utils import instantiate

    cfg = compose_cfg("hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides, hydra=True)
    launcher = instantiate(cfg.hydra.launcher)
    assert type(launcher).__name__ == "SlurmLauncher"
    return launcher.params


def sbatch_script(params: dict, bin_dir: Path) -> str:
    """The sbatch script submitit writes for the launcher's parameters, as the plugin passes them
    (hydra_submitit_launcher's BaseSubmititLauncher.launch), without a cluster: a stand-in ``srun``
    on PATH satisfies submitit's check that SLURM is there; nothing is submitted."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "srun").chmod(0o755)
    params = dict(params)
    folder = params.pop("submitit_folder")
    with mock.patch.dict(os.environ, {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}):
        executor = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_max_num_timeout=params.pop("max_num_timeout"))
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
    slurm = executor._executor
    return slurm._make_submission_file_text(slurm._submitit_command_str, "uid")


def test_the_slurm_launcher_asks_for_the_strategy_s_nodes_tasks_gpus_and_cores(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason=NEEDS_PLUGIN)
    params = slurm_launcher_params(
        tmp_path, "strategy=ssp_delay", "trainer=gpu", "trainer.devices=4", "trainer.num_nodes=2", "hydra.launcher.partition=gpu"
    )
    assert {k: params[k] for k in ("nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "partition", "timeout_min")} == {
        "nodes": 2, "tasks_per_node": 4, "gpus_per_node": 4, "cpus_per_task": GPU + 1, "partition": "gpu", "timeout_min": 60
    }
    assert params["submitit_folder"] == f"{tmp_path / 'sweep'}/.submitit/%j" and params["name"] == "cli"
    script = sbatch_script(params, tmp_path / "bin")
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 f"#SBATCH --cpus-per-task={GPU + 1}", "#SBATCH --partition=gpu", "#SBATCH --time=60", "#SBATCH --job-name=cli"):
        assert line in script.splitlines(), script
    assert "\nsrun " in script and "-m submitit.core._submit" in script
    # a value set on the command line wins over the computed one
    assert slurm_launcher_params(tmp_path, "strategy=ssp_delay", "hydra.launcher.cpus_per_task=16")["cpus_per_task"] == 16


@pytest.mark.multiprocess
def test_an_ssp_job_of_two_tasks_through_submitit_s_local_executor(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason=NEEDS_PLUGIN)
    sweep = tmp_path / "sweep"
    proc = run_cli(
        "-m", "hydra/launcher=slurm_local", "experiment=smoke", "strategy=ssp_delay", "trainer.devices=2",
        "allow_cpu_oversubscription=true", f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=240,
    )
    assert "Submitit 'local' sweep output dir" in proc.stdout + proc.stderr
    # one job of two tasks, each a rank of its own (the job's id is its controller's pid)
    (job_dir,) = [p for p in (sweep / ".submitit").iterdir() if p.name != "%j"]
    logs = {task: "".join((job_dir / f"{job_dir.name}_{task}_log.{kind}").read_text() for kind in ("out", "err"))
            for task in (0, 1)}
    for task, log in logs.items():
        assert "Job completed successfully" in log, log[-3000:]
        assert f"global_rank={task}(2)" in log and f"GLOBAL_RANK: {task}, MEMBER: {task + 1}/2" in log, log[-3000:]
    assert "[parameter server]" in logs[0] and "[parameter server]" not in logs[1], "the server runs beside rank 0"
    assert not list((sweep / "0").glob("train_*process_1.log")), "Lightning must not have started a rank of its own"
    # both ranks trained through the server, which rank 0 reports
    metrics = json.loads((sweep / "0" / "metrics.json").read_text())
    assert metrics["ssp/worker0/iterations"] + metrics["ssp/worker1/iterations"] == 8  # 512 samples / 64, pooled
    assert min(metrics["ssp/worker0/iterations"], metrics["ssp/worker1/iterations"]) > 0
    assert metrics["server/pushes"] > 0 and metrics["server/steps"] > 0
    assert {"val/acc", "test/acc"} <= set(metrics)
    assert (sweep / "0" / "checkpoints" / "last.ckpt").is_file()
