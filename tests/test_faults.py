"""Faults in real runs: a SIGKILLed worker or parameter server ends the run on every rank, with one
last message naming the process that died, and leaves no process behind."""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from conftest import alive, run_train_script, shared_train_script
from leftovers import shared_memory_left

pytestmark = pytest.mark.multiprocess


def pids(out: Path) -> dict[str, int]:
    return {f.name.removeprefix("pid_"): int(f.read_text()) for f in out.glob("pid_*")}


def last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc (Linux)")
@pytest.mark.parametrize(
    "strategy, victim, fork_ranks",
    [("ssp", "worker", False), ("ssp", "server", False), ("cneural", "worker", False), ("cneural", "server", False),
     ("ssp", "worker", True), ("cneural", "server", True)],
)
def test_a_killed_process_ends_the_run_naming_it(tmp_path, strategy, victim, fork_ranks):
    kill = ["--kill-rank", "1", "--kill-step", "3"] if victim == "worker" else ["--kill-server-step", "3"]
    proc = run_train_script(tmp_path, "--strategy", strategy, "--staleness", "2", "--timeout", "30", *kill,
                            check=False, timeout=120, fork_ranks=fork_ranks)
    ended = time.time()
    assert proc.returncode != 0
    started = pids(tmp_path)
    assert {"rank0", "rank1", "server"} <= set(started), (started, proc.stderr[-3000:])
    name = r"worker rank 1" if victim == "worker" else r"parameter server"
    dead = started["rank1" if victim == "worker" else "server"]
    pattern = rf"lightning-hybrid: {name} \(pid {dead}\) was killed by signal SIGKILL; the run is stopped"
    assert re.search(pattern, last_line(proc.stderr)), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr.split("lightning-hybrid:")[-1]
    assert not [role for role, pid in started.items() if alive(pid)], "a process outlived the run"
    assert shared_memory_left(started) == [], "a segment was left in /dev/shm"
    to_exit = ended - float((tmp_path / "killed_at").read_text())
    print(f"{strategy}, {victim} killed: the run ended {to_exit:.2f} s later")
    assert to_exit < 10, f"the run took {to_exit:.1f} s to end after the kill (timeout 30 s)"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc (Linux)")
@pytest.mark.parametrize("fork_ranks", [False, True])
def test_no_process_outlives_a_normal_run(tmp_path, fork_ranks):
    run_train_script(tmp_path, "--strategy", "ssp", "--staleness", "2", "--epochs", "1", fork_ranks=fork_ranks)
    started = pids(tmp_path)
    assert {"rank0", "rank1", "server"} <= set(started), started
    assert not [role for role, pid in started.items() if alive(pid)], "a process outlived the run"
    assert shared_memory_left(started) == [], "a segment was left in /dev/shm"
    assert os.environ.get("LIGHTNING_HYBRID_LAUNCHER_PID") is None  # the test process itself is no launcher


def trained_per_epoch(out: Path) -> dict[int, Counter]:
    """epoch -> how often each sample index was trained on, over all ranks (trained_rank*.txt)."""
    counts: dict[int, Counter] = {}
    for record in out.glob("trained_rank*.txt"):
        for line in record.read_text().splitlines():
            epoch, indices = line.split()
            counts.setdefault(int(epoch), Counter()).update(int(i) for i in indices.split(","))
    return counts


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc (Linux)")
@pytest.mark.parametrize("staleness", ["2", "0"])
def test_with_continue_a_killed_workers_batches_go_to_the_others(tmp_path, staleness):
    """SSPStrategy(on_worker_failure="continue"): worker 1 is SIGKILLed in the middle of epoch 1 of 3;
    the run completes with workers 0 and 2, every sample is trained on exactly once in every epoch
    (the batches it held are dealt again), and the accuracy is that of a run without the fault."""
    setting = ("--strategy", "ssp", "--devices", "3", "--staleness", staleness, "--samples", "960", "--epochs", "3",
               "--lr", "0.02", "--noise", "6", "--test-samples", "1024", "--timeout", "30", "--record-batches")
    faulty = run_train_script(tmp_path / "fault", *setting, "--kill-rank", "1", "--kill-step", "5", "--kill-epoch", "1",
                              "--on-worker-failure", "continue", timeout=120)
    started = pids(tmp_path / "fault")
    pattern = rf"lightning-hybrid: worker rank 1 \(pid {started['rank1']}\) was killed by signal SIGKILL; the run goes on"
    assert re.search(pattern, faulty.stderr), faulty.stderr[-3000:]
    assert "continuing without worker(s) 1" in faulty.stderr
    assert not [role for role, pid in started.items() if alive(pid)], "a process outlived the run"
    trained = trained_per_epoch(tmp_path / "fault")
    assert sorted(trained) == [0, 1, 2]
    for epoch, counts in trained.items():
        assert sorted(counts) == list(range(960)) and set(counts.values()) == {1}, f"epoch {epoch}"
    dead_rank_epochs = {int(line.split()[0]) for line in (tmp_path / "fault" / "trained_rank1.txt").read_text().splitlines()}
    assert dead_rank_epochs == {0, 1}  # it trained until it was killed in epoch 1
    summary = json.loads((tmp_path / "fault" / "summary.json").read_text())
    assert summary["predictions"] == 1024 // 2  # evaluation after the fit is split between the two survivors
    run_train_script(tmp_path / "reference", *setting, timeout=120)
    accuracy = {run: float((tmp_path / run / "test_acc.txt").read_text()) for run in ("fault", "reference")}
    print(f"staleness {staleness}: test accuracy {accuracy}")
    assert accuracy["reference"] > 0.5  # the comparison means something: the task is learned, not solved
    assert abs(accuracy["fault"] - accuracy["reference"]) < 0.07, accuracy


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc (Linux)")
@pytest.mark.parametrize("kill_epoch", [0, 2])
def test_cneural_with_continue_ends_with_the_parameters_of_a_run_without_the_fault(tmp_path, tmp_path_factory, kill_epoch):
    """CNeuralStrategy(on_worker_failure="continue"): worker 1 of 3 is SIGKILLed in the middle of a
    pass; worker 2 computes the lost worker's share of that pass (and of every later one) at the
    pass's parameters, so each pass is still one step of full-batch gradient descent over every
    sample: the final parameters equal those of the run without the fault."""
    setting = ("--strategy", "cneural", "--devices", "3", "--samples", "960", "--epochs", "3", "--lr", "0.5",
               "--noise", "6", "--test-samples", "1024", "--timeout", "30")
    faulty = run_train_script(tmp_path / "fault", *setting, "--kill-rank", "1", "--kill-step", "5",
                              "--kill-epoch", str(kill_epoch), "--on-worker-failure", "continue", timeout=120)
    started = pids(tmp_path / "fault")
    pattern = rf"lightning-hybrid: worker rank 1 \(pid {started['rank1']}\) was killed by signal SIGKILL; the run goes on"
    assert re.search(pattern, faulty.stderr), faulty.stderr[-3000:]
    assert "worker 2 computed the pass of lost worker 1 (320 samples)" in faulty.stderr
    assert not [role for role, pid in started.items() if alive(pid)], "a process outlived the run"
    reference = shared_train_script(tmp_path_factory, *setting)
    expected = torch.load(reference / "rank0.pt")
    for rank in (0, 2):
        final = torch.load(tmp_path / "fault" / f"rank{rank}.pt")
        for name, value in expected.items():
            torch.testing.assert_close(final[name], value, rtol=1e-5, atol=1e-6, msg=f"rank {rank}: {name}")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc (Linux)")
def test_a_killed_server_shard_ends_the_run_naming_it(tmp_path):
    proc = run_train_script(tmp_path, "--strategy", "ssp", "--staleness", "2", "--timeout", "30", "--servers", "2",
                            "--kill-server-step", "3", "--kill-shard", "1", check=False, timeout=120)
    assert proc.returncode != 0
    started = pids(tmp_path)
    assert {"rank0", "rank1", "server", "server1"} <= set(started), (started, proc.stderr[-3000:])
    pattern = rf"lightning-hybrid: parameter server shard 1 \(pid {started['server1']}\) was killed by signal SIGKILL"
    assert re.search(pattern, last_line(proc.stderr)), proc.stderr[-3000:]
    assert not [role for role, pid in started.items() if alive(pid)], "a process outlived the run"
    assert shared_memory_left(started) == [], "a segment was left in /dev/shm"
