"""The process watch names the cause when one poll finds several processes of a run dead."""

from __future__ import annotations

import subprocess
import sys

from lightning_hybrid.strategies.rank_exit_watch import RankExitWatch


def ended(code: int) -> subprocess.Popen:
    """A real process that has ended with ``code`` (negative: killed by that signal)."""
    if code < 0:
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        process.send_signal(-code)
    else:
        process = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    process.wait(timeout=30)
    return process


def test_a_killed_worker_is_named_before_the_server_that_failed_because_of_it():
    watch = RankExitWatch()
    watch.add("parameter server", None, ended(1))  # added first, as the parameter-server strategy does
    watch.add("worker", 0, ended(0))
    watch.add("worker", 1, ended(-9))
    dead = watch.dead()
    assert (dead.role, dead.rank) == ("worker", 1)


def test_a_rank_that_failed_is_named_before_a_server_that_failed_with_it():
    watch = RankExitWatch()
    watch.add("parameter server", None, ended(1))
    watch.add("worker", 1, ended(2))
    assert watch.dead().rank == 1


def test_a_killed_server_is_named_before_the_ranks_that_lost_it():
    watch = RankExitWatch()
    watch.add("worker", 1, ended(1))
    watch.add("parameter server", None, ended(-9))
    assert watch.dead().role == "parameter server"


def test_no_death_no_name():
    watch = RankExitWatch()
    watch.add("worker", 1, ended(0))
    assert watch.dead() is None
