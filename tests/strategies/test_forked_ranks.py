"""Ranks forked from the main process at launch (``fork_ranks=True``) train as re-run scripts do."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import torch
from conftest import REFERENCE, run_train_script

from lightning_hybrid import SSPStrategy
from lightning_hybrid.strategies.forked_ranks import ForkedProcess, Standby, fork_ranks


def forked(exit_code: int | None, sleep_s: float = 0.0) -> ForkedProcess:
    """A forked child that sleeps ``sleep_s`` then exits with ``exit_code``."""
    pid = os.fork()
    if pid == 0:
        time.sleep(sleep_s)
        os._exit(exit_code)
    return ForkedProcess(pid)


def test_forked_process_reports_exit_codes_and_signals():
    done = forked(3)
    assert done.wait(timeout=10) == 3 and done.poll() == 3
    sleeping = forked(0, sleep_s=30)
    assert sleeping.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        sleeping.wait(timeout=0.05)
    sleeping.kill()
    assert sleeping.wait(timeout=10) == -signal.SIGKILL
    sleeping.kill()  # a dead process: nothing happens


def test_fork_ranks_gives_each_child_its_local_rank(tmp_path):
    local_rank, children = fork_ranks(3)
    if local_rank:  # a child: report and leave at once
        (tmp_path / f"rank{local_rank}").write_text(os.environ["LOCAL_RANK"])
        os._exit(0)
    assert [child.wait(timeout=30) for child in children] == [0, 0]
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"rank1": "1", "rank2": "2"}


def test_a_standby_runs_its_target_with_the_message_it_is_started_with(tmp_path):
    def target(message: str) -> None:
        (tmp_path / "got").write_text(message)
        os._exit(7)

    standby = Standby(target)
    assert standby.process.poll() is None  # waiting for its message
    assert standby.start("settings " * 10000).wait(timeout=30) == 7  # longer than a pipe's buffer
    assert (tmp_path / "got").read_text() == "settings " * 10000
    failing = Standby(lambda message: 1 / 0)
    assert failing.start("x").wait(timeout=30) == 1


def test_fork_ranks_must_be_a_bool_or_auto():
    with pytest.raises(ValueError, match="fork_ranks must be True, False or 'auto'"):
        SSPStrategy(fork_ranks="yes")
    assert SSPStrategy(fork_ranks="auto", parallel_devices=[torch.device("cpu")] * 2).forks_ranks
    assert not SSPStrategy(fork_ranks="auto", parallel_devices=[torch.device("cuda", 0)] * 2).forks_ranks


@pytest.mark.multiprocess
def test_forked_ranks_train_as_re_run_scripts(tmp_path):
    # Bulk-synchronous SSP is deterministic: the two ways of starting rank 1 must give the same run,
    # and rank 1 runs the script's code after trainer.fit in both (it writes its own files).
    args = ("--strategy", "ssp", "--staleness", "0", *REFERENCE, "--epochs", "1", "--samples", "128")
    run_train_script(tmp_path / "popen", *args, fork_ranks=False)
    run_train_script(tmp_path / "fork", *args, fork_ranks=True)
    for rank in (0, 1):
        popen = torch.load(tmp_path / "popen" / f"rank{rank}.pt")
        fork = torch.load(tmp_path / "fork" / f"rank{rank}.pt")
        assert popen.keys() == fork.keys()
        for name in popen:
            torch.testing.assert_close(fork[name], popen[name], rtol=0, atol=0)
        assert torch.load(tmp_path / "fork" / f"indices_rank{rank}.pt") == torch.load(
            tmp_path / "popen" / f"indices_rank{rank}.pt"
        )
    pids = {p.name: int(p.read_text()) for p in (tmp_path / "fork").glob("pid_rank*")}
    assert len(set(pids.values())) == 2, pids
