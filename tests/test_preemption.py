"""Preemption: a run stopped by a signal exits non-zero with one line naming the signal and its
checkpoint, and the same command run again resumes from it to the parameters of an uninterrupted
run; SLURM's requeue signal saves a mid-epoch checkpoint and requeues the job (a stand-in
``scontrol``); a run folder of another configuration is never resumed silently. The run-folder and
SLURM helpers are tested without Lightning first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from conftest import Zygote, alive, clean_env, free_port
from preemption_runs import SMALL, STRATEGIES, SUPPORT, callbacks, last_line, run
from threads import threads_per_process

from lightning_hybrid import run_folder
from lightning_hybrid.preemption import Stop, requeue_slurm_job, slurm_job_id

# ---------------------------------------------------------------------- the run folder, plain Python
CONFIG = {"seed": 0, "model": {"hidden": 32}, "trainer": {"max_epochs": 4}, "paths": {"output_dir": "x"}, "test": True}


def checkpoint_in(folder: Path, name: str = "last.ckpt") -> Path:
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    path = folder / "checkpoints" / name
    path.write_bytes(b"ckpt")
    return path


def test_a_folder_of_the_same_configuration_resumes_from_its_newest_checkpoint(tmp_path):
    assert run_folder.checkpoint_to_resume(tmp_path, CONFIG) is None, "no checkpoint: start afresh"
    run_folder.write_record(tmp_path, CONFIG, "interrupted")
    checkpoint_in(tmp_path, "last.ckpt")
    time.sleep(0.01)
    newest = checkpoint_in(tmp_path, "last-interrupted.ckpt")
    where = {**CONFIG, "paths": {"output_dir": "elsewhere"}, "test": False}  # not what the fit computes
    assert run_folder.checkpoint_to_resume(tmp_path, where) == newest


def test_a_folder_of_another_configuration_is_refused_naming_the_keys(tmp_path):
    run_folder.write_record(tmp_path, CONFIG, "interrupted")
    checkpoint_in(tmp_path)
    changed = {**CONFIG, "model": {"hidden": 64}, "trainer": {"max_epochs": 4, "devices": 2}}
    with pytest.raises(run_folder.ResumeRefused) as refused:
        run_folder.checkpoint_to_resume(tmp_path, changed)
    message = str(refused.value)
    assert "model.hidden: 32 -> 64" in message and "trainer.devices: (absent) -> 2" in message
    assert "ckpt_path=null" in message and "hydra.run.dir" in message


def test_checkpoints_without_a_record_are_not_resumed(tmp_path):
    checkpoint_in(tmp_path)
    with pytest.raises(run_folder.ResumeRefused, match="no run.yaml"):
        run_folder.checkpoint_to_resume(tmp_path, CONFIG)


def test_the_interrupted_sibling_of_the_same_configuration_is_found(tmp_path):
    runs = {name: tmp_path / name for name in ("finished", "other_config", "interrupted", "running", "new")}
    for name, status, config in (("finished", "finished", CONFIG), ("other_config", "interrupted", {**CONFIG, "seed": 1}),
                                 ("interrupted", "interrupted", CONFIG), ("running", "running", CONFIG)):
        run_folder.write_record(runs[name], config, status)
        checkpoint_in(runs[name])
    assert run_folder.interrupted_run(runs["new"], CONFIG) == runs["interrupted"]
    run_folder.update_status(runs["interrupted"], "finished")
    assert run_folder.interrupted_run(runs["new"], CONFIG) is None


def test_stop_line_and_exit_status():
    stop = Stop("SIGTERM", epoch=2, batches_done=3, batches=8, checkpoint=Path("run/checkpoints/interrupted.ckpt"),
                mid_epoch=True)
    assert stop.exit_code == 143 and Stop("SIGINT").exit_code == 130
    assert stop.summary().startswith("stopped by SIGTERM in epoch 3 after 3 of 8 batches: checkpoint run/checkpoints/")
    requeued = Stop("SIGUSR2", checkpoint=Path("c.ckpt"), mid_epoch=True, requeued="77_3")
    assert "SLURM job 77_3 requeued" in requeued.summary()
    assert "repeats this epoch" in Stop("SIGTERM", checkpoint=Path("e.ckpt"), strategy="SSPStrategy").summary()


def stand_in_scontrol(folder: Path, returncode: int = 0) -> Path:
    """A ``scontrol`` that records its arguments in ``folder/scontrol.txt``."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> "{folder}/scontrol.txt"\nexit {returncode}\n')
    script.chmod(0o755)
    return folder / "scontrol.txt"


def test_requeue_runs_scontrol_with_the_job_id(tmp_path, monkeypatch):
    record = stand_in_scontrol(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert slurm_job_id({"SLURM_JOB_ID": "4242"}) == "4242"
    assert slurm_job_id({"SLURM_JOB_ID": "4250", "SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": "8"}) == "4242_8"
    assert slurm_job_id({}) is None
    assert requeue_slurm_job("4242_8")
    assert record.read_text().split() == ["requeue", "4242_8"]
    assert not requeue_slurm_job("4242; rm -rf /"), "not a job id"


# ---------------------------------------------------------------------- runs of the command, stopped
def slurm_tasks(tmp_path: Path, overrides: tuple[str, ...], port: int, scontrol_dir: Path) -> list[subprocess.CompletedProcess]:
    """The command as the 2 tasks of SLURM job 4242 (``srun`` variables, one rank each), started together
    (each forked from the tests' pre-imported Python: tests/support/zygote.py)."""
    env = {k: v for k, v in clean_env(HYDRA_FULL_ERROR="0", PYTHONWARNINGS="ignore", PYTHONPATH=str(SUPPORT)).items()
           if k not in ("RANK",) and not k.startswith("SLURM_")}
    env["PATH"] = f"{scontrol_dir}{os.pathsep}{env['PATH']}"
    argv = ["-m", "lightning_hybrid.cli", *SMALL, *overrides, f"cpu_threads_per_process={threads_per_process(2)}"]
    logs = [(tmp_path / f"task{task}.out", tmp_path / f"task{task}.err") for task in (0, 1)]
    processes = [
        Zygote.start(argv, {
            **env, "SLURM_NTASKS": "2", "SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "2", "SLURM_PROCID": str(task),
            "SLURM_LOCALID": str(task), "SLURM_NODEID": "0", "SLURM_NODELIST": "127.0.0.1", "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NAME": "preempted", "MASTER_PORT": str(port)}, tmp_path, *logs[task])
        for task in (0, 1)
    ]
    done = []
    for process, (out, err) in zip(processes, logs):
        try:
            process.wait(timeout=180)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            pytest.fail("a SLURM task did not end")
        done.append(subprocess.CompletedProcess(process.args, process.returncode, out.read_text(), err.read_text()))
    return done


def trained_samples(folder: Path, ranks: str = "*") -> dict[int, Counter]:
    per_epoch: dict[int, Counter] = {}
    for path in folder.glob(f"samples_rank{ranks}.txt"):
        for line in path.read_text().splitlines():
            epoch, *sums = line.split()
            per_epoch.setdefault(int(epoch), Counter()).update(sums)
    return per_epoch


#: The strategies whose stop's checkpoint continues the epoch (the others repeat it).
MID_EPOCH = ("ddp", "balanced", "delayed_averaging", "local_sgd", "hybrid")


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["ddp"])  # SLURM's requeue path; every strategy's stop and exact resume
# (the parameter servers' repeated epoch included) is in tests/test_fault_matrix.py
def test_slurm_requeue_signal_checkpoints_requeues_and_the_restarted_job_continues(tmp_path, strategy):
    scontrol = stand_in_scontrol(tmp_path / "bin")
    settings = [o for o in STRATEGIES[strategy] if "fork_ranks" not in o]  # SLURM starts every rank
    overrides = (*settings, "trainer.devices=2", f"hydra.run.dir={tmp_path / 'run'}",
                 *callbacks(tmp_path, "resumed", epoch=1, batch=1, signame="SIGUSR2", every_rank="true"),
                 "+callbacks.samples._target_=preemption_callbacks.SampleFingerprints",
                 f"+callbacks.samples.folder={tmp_path}")
    first = slurm_tasks(tmp_path, overrides, free_port(), tmp_path / "bin")
    assert [task.returncode for task in first] == [128 + signal.SIGUSR2] * 2, first[0].stderr[-3000:]
    assert scontrol.read_text().split() == ["requeue", "4242"], "rank 0 requeues the job once"
    line = last_line(first[0])
    assert "stopped by SIGUSR2 in epoch 2" in line and "SLURM job 4242 requeued" in line, line
    ranks = "0" if strategy == "hybrid" else "*"  # the pipeline's two stages load the same batches: count one
    before = trained_samples(tmp_path, ranks)

    second = slurm_tasks(tmp_path, overrides, free_port(), tmp_path / "bin")  # the requeued job: the same command
    assert [task.returncode for task in second] == [0, 0], second[0].stderr[-3000:]
    assert scontrol.read_text().count("requeue") == 1
    per_epoch = trained_samples(tmp_path, ranks)
    epoch_samples = sum(per_epoch[0].values())
    assert all(sum(per_epoch[e].values()) >= epoch_samples for e in (2, 3)), "the later epochs train in full"
    if strategy in MID_EPOCH:  # the mid-epoch checkpoint: the epoch goes on with the samples it had not trained
        assert "resumed in epoch 2" in second[0].stdout + second[0].stderr
        assert 0 < sum(before[1].values()) < epoch_samples
        assert set(per_epoch[1].values()) == {1} and sum(per_epoch[1].values()) == epoch_samples, \
            "each sample of the interrupted epoch trained once"
    else:  # the parameter-server strategies restart the epoch from its start
        assert "repeats this epoch" in line
        assert sum(per_epoch[1].values()) == epoch_samples + sum(before[1].values())


def test_ctrl_c_then_the_same_command_resumes_in_the_interrupted_folder_and_other_settings_are_refused(tmp_path):
    """One process, Hydra's timestamped folders: Ctrl+C (SIGINT) exits 130 naming the checkpoint; the
    same command, in a new folder, continues the interrupted run in its folder; the same folder with
    another learning rate is refused, naming it."""
    command = ("trainer.devices=1", *callbacks(tmp_path, "resumed", epoch=1, batch=1, signame="SIGINT"))
    stopped = run(*command, cwd=tmp_path)
    assert stopped.returncode == 130, (stopped.stdout + stopped.stderr)[-3000:]
    assert "stopped by SIGINT in epoch 2 after 2 of" in last_line(stopped)
    (first,) = (tmp_path / "outputs" / "runs").iterdir()
    assert run_folder.read_record(first)["status"] == "interrupted"
    time.sleep(1.1)  # the next command's folder is named by the second it starts in
    resumed = run(*command, cwd=tmp_path)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert f"resuming the interrupted run of this configuration in {first}" in resumed.stdout
    assert run_folder.read_record(first)["status"] == "finished" and (first / "metrics.json").is_file()
    assert len(list((tmp_path / "outputs" / "runs").iterdir())) == 2, "the new folder keeps only the command's log"

    refused = run(*command, "optimizer.lr=0.2", f"hydra.run.dir={first}", cwd=tmp_path)
    assert refused.returncode != 0 and "optimizer.lr: 0.05 -> 0.2" in refused.stdout + refused.stderr


def meeting_of_a_stand_in_trainer(accumulate: int):
    """A BatchMeeting over a stand-in for a Trainer of 2 ranks (what the meeting reads of one), and its
    batch counter."""
    from types import SimpleNamespace

    import pytorch_lightning as pl

    from lightning_hybrid.strategies.meeting import BatchMeeting

    class StandIn(pl.Trainer):
        world_size = 2
        strategy = SimpleNamespace(launcher=None)

        def __init__(self) -> None:  # none of Lightning's set-up
            self.accumulate_grad_batches = accumulate
            self._signal_connector = SimpleNamespace(received_sigterm=False)
            self.fit_loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(current=progress)))

    progress = SimpleNamespace(completed=0)
    trainer = StandIn()
    return BatchMeeting(trainer), trainer, progress


def test_with_gradient_accumulation_the_ranks_stop_at_an_optimizer_step(tmp_path):
    """A request agreed in a batch stops the fit at the first batch boundary that is also an optimizer
    step's, with one agreement (an all-reduce) per batch until the request arrives and none after (a
    one-rank gloo group here); the agreed signal is the one asked for."""
    import torch.distributed as dist
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    meeting, trainer, progress = meeting_of_a_stand_in_trainer(accumulate=4)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        stopped_at = None
        for batch in range(12):
            progress.completed = batch  # batches done in the epoch when batch `batch` is about to start
            if batch == 5:
                meeting.request_stop(signal.SIGUSR2)  # the signal, during batch 4
            try:
                meeting()
            except SIGTERMException:
                stopped_at = batch
                break
        assert stopped_at == 8 and trainer._signal_connector.received_sigterm, stopped_at
        assert meeting.agreed_signal == "SIGUSR2"
    finally:
        dist.destroy_process_group()


def test_lightning_s_last_finds_the_stop_s_checkpoints(tmp_path):
    """Python users resume with ``ckpt_path="last"``: Lightning's search takes the callback's files."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    from lightning_hybrid.preemption import CHECKPOINT_NAME, EPOCH_END_NAME

    for name in ("last.ckpt", CHECKPOINT_NAME, EPOCH_END_NAME, "epoch003.ckpt"):
        (tmp_path / name).write_bytes(b"")
    found = {Path(p).name for p in ModelCheckpoint(dirpath=tmp_path)._find_last_checkpoints(None)}
    assert found == {"last.ckpt", CHECKPOINT_NAME, EPOCH_END_NAME}


@pytest.mark.multiprocess
def test_ctrl_c_in_a_terminal_stops_ranks_and_servers_that_all_receive_it(tmp_path):
    """Ctrl+C reaches every process of the terminal's group (ranks, parameter server): one orderly stop,
    exit status 130, no traceback, nobody left (the ranks passed SIGINT on get SIGTERM, not a second
    SIGINT that would interrupt them at once)."""
    command = [sys.executable, "-m", "lightning_hybrid.cli", *SMALL, *STRATEGIES["ssp"], "trainer.devices=2",
               f"hydra.run.dir={tmp_path / 'run'}", f"cpu_threads_per_process={threads_per_process(2)}",
               *callbacks(tmp_path, "resumed", epoch=1, batch=1, signame="SIGINT", process_group="true")]
    env = clean_env(HYDRA_FULL_ERROR="0", PYTHONWARNINGS="ignore", PYTHONPATH=str(SUPPORT))
    logs = tmp_path / "out.log", tmp_path / "err.log"
    process = Zygote.start(command[1:], env, tmp_path, *logs, new_session=True)  # a process group of its own, as a terminal's job
    try:
        process.wait(timeout=180)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    out, err = (log.read_text() for log in logs)
    assert process.returncode == 130, (out + err)[-4000:]
    assert "stopped by SIGINT in epoch 2" in last_line(subprocess.CompletedProcess(command, 130, out, err))
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err, (out + err)[-4000:]
    pids = [int(p.read_text()) for p in (tmp_path / "pids").iterdir()]
    assert len(pids) >= 3 and not [pid for pid in pids if alive(pid)], "ranks and server all ended"
