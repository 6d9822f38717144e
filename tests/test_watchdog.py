"""A desynchronised collective is caught in seconds: by the watchdog (every rank's stack, one message
naming each rank's position), and, with the watchdog off, by torch's collective check that the tests
run under (``TORCH_DISTRIBUTED_DEBUG=DETAIL``). The watch itself is tested without Lightning first."""

from __future__ import annotations

import threading
import time

import pytest

from lightning_hybrid.comm.stall_watch import StallWatch, describe_position, stall_message
from preemption_runs import run


def test_a_stalled_rank_reports_where_its_main_thread_waits(tmp_path):
    ended = []
    stream = (tmp_path / "log").open("w+")  # faulthandler writes to a file descriptor
    watch = StallWatch(0, 1, limit_s=0.3, board=None, end_run=ended.append, stream=stream, poll_s=0.05,
                       setting="watchdog_s=0.3")
    # The watched thread is this test's: it beats, then waits in a call of its own.
    watch._main = threading.current_thread()
    watch.start()
    watch.beat()
    deadline = time.monotonic() + 10
    while not ended and time.monotonic() < deadline:
        time.sleep(0.05)  # no beat: a stall
    watch.stop()
    assert watch.stalled and len(ended) == 1
    message = ended[0]
    assert "no progress for" in message and "watchdog_s=0.3" in message, message
    assert "rank 0: " in message and "test_a_stalled_rank_reports_where_its_main_thread_waits" in message, message
    stream.seek(0)
    assert "test_a_stalled_rank_reports_where_its_main_thread_waits" in stream.read(), "the stack was written"


def test_a_beating_rank_is_not_stalled_and_the_limit_follows_the_longest_step():
    watch = StallWatch(0, 1, limit_s=0.2, board=None, end_run=pytest.fail, slack=10.0, poll_s=0.02)
    watch.start()
    for _ in range(10):
        watch.beat()
        time.sleep(0.05)
    watch.stop()
    assert not watch.stalled
    assert watch.limit >= 10 * 0.05 - 1e-3, "ten times the longest gap between beats"


def test_the_message_says_out_of_step_or_in_step():
    apart = stall_message({0: "all_reduce (a:1) from X.on_train_epoch_end (b:2)", 1: "barrier (a:9) from Y (c:3)"},
                          12.0, 10.0, "watchdog_s=10")
    assert "out of step" in apart and "rank 0: all_reduce" in apart and "rank 1: barrier" in apart
    together = stall_message({0: "recv (a:1)", 1: "recv (a:1)", 2: None}, 12.0, 10.0, "watchdog_s=10")
    assert "same call" in together and "rank 2: no answer" in together


def test_a_position_names_the_waiting_call_and_the_code_that_issued_it():
    import sys

    def issuer():
        return describe_position(sys._getframe())

    assert describe_position(None).startswith("(no Python frame")
    assert "issuer (tests/test_watchdog.py:" in issuer()


# ---------------------------------------------------------------------- real runs through the command
DESYNC = ("+callbacks.desync._target_=preemption_callbacks.ExtraCollectiveOnRankZero", "trainer.max_epochs=2")


@pytest.mark.multiprocess
def test_a_desynchronised_collective_ends_the_run_within_a_minute_naming_each_rank_s_position(tmp_path):
    """SSP (the hang of the README's example: its workers' waits for their server do not count) with
    one collective too many on rank 0 at the first epoch's end, as users run it (no collective check):
    every rank's stack, then one message, exit status 1; and the watchdog's limit below the server's own
    timeout, so that the server does not give up on a worker first and blame it."""
    started = time.monotonic()
    proc = run("strategy=ssp_delay", "strategy.fork_ranks=true", "trainer.devices=2", "strategy.timeout=15", "watchdog_s=60",
               *DESYNC, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env={"TORCH_DISTRIBUTED_DEBUG": "OFF"},
               timeout=120)
    took = time.monotonic() - started
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, f"exit status {proc.returncode}:\n{output[-4000:]}"
    assert took < 60, f"the run took {took:.0f} s to end"
    message = output[output.rindex("lightning-hybrid: the ranks are out of step"):]
    assert "(the limit is 12 s, watchdog_s=60)" in message, "80 % of the server's timeout"
    assert "rank 0: all_reduce" in message and "ExtraCollectiveOnRankZero.on_train_epoch_end" in message, message
    assert "rank 1: " in message, message
    assert output.count("its Python stack:") == 2, "every rank wrote its stack"


@pytest.mark.multiprocess
def test_with_the_watchdog_off_the_collective_check_names_the_mismatch(tmp_path):
    started = time.monotonic()
    proc = run("strategy=ddp", "trainer.devices=2", "watchdog_s=null", *DESYNC, f"hydra.run.dir={tmp_path / 'run'}",
               cwd=tmp_path, timeout=120)
    took = time.monotonic() - started
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and took < 60, (proc.returncode, took, output[-3000:])
    assert "Detected mismatch between collectives on ranks" in output, output[-3000:]
