"""Faults in real runs: a SIGKILLed worker or parameter server ends the run on every rank, with one
last message naming the process that died, and leaves no process behind."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from conftest import alive, run_train_script

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
    assert os.environ.get("LIGHTNING_HYBRID_LAUNCHER_PID") is None  # the test process itself is no launcher
