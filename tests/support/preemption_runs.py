"""Runs of the command that a signal stops (tests/test_preemption.py, tests/test_fault_matrix.py,
tests/test_watchdog.py, the strategies' resume tests and tests/gpu): a small setting, each strategy at a
deterministic setting, the command with the tests' callbacks (tests/support/preemption_callbacks.py)
importable in every rank."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import Zygote, clean_env
from threads import threads_per_process

#: The folder of the callbacks the runs add (``preemption_callbacks``): on every rank's PYTHONPATH.
SUPPORT = Path(__file__).resolve().parent


SMALL = ("experiment=smoke", "trainer.max_epochs=4", "trainer.limit_train_batches=6", "test=false",
         "allow_cpu_oversubscription=true", "trainer.enable_progress_bar=false", "progress=bar")
#: Each strategy at a setting where it is deterministic (staleness 0); ranks forked from the
#: command's process (faster to start) except under ddp (Lightning's launcher) and ssp (ours), which rerun
#: the command for each rank as users' runs do.
STRATEGIES = {
    "ddp": ("strategy=ddp",),
    "balanced": ("strategy=balanced", "strategy.fork_ranks=true"),
    "ssp": ("strategy=ssp_delay", "strategy.staleness=0"),  # our launcher rerunning the command, as users run it
    # The delayed all-reduce (DGA) and local SGD are deterministic at any delay; a stop lands up to their delay (or
    # round) after the signal, so their epochs have 6 batches, room for each case's stop within the epoch.
    "delayed_averaging": ("strategy=delayed_averaging", "strategy.delay=1", "strategy.fork_ranks=true", "data.num_train=1024"),
    "local_sgd": ("strategy=local_sgd", "strategy.sync_every=2", "strategy.delay=1", "strategy.fork_ranks=true",
                  "data.num_train=1024"),
    "cneural": ("strategy=cneural", "strategy.fork_ranks=true"),
    "hybrid": ("strategy=hybrid", "strategy.placement=uniform", "strategy.fork_ranks=true"),
}


def run(*overrides: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """``lightning-hybrid`` with the tests' callbacks importable in every rank."""
    env = clean_env(HYDRA_FULL_ERROR="0", PYTHONWARNINGS="ignore", PYTHONPATH=str(SUPPORT), **(env or {}))
    return Zygote.run(["-m", "lightning_hybrid.cli", *SMALL, *overrides, f"cpu_threads_per_process={threads_per_process(2)}"],
                      env, cwd, timeout)


def callbacks(folder: Path, name: str, **signal_at: object) -> list[str]:
    added = ["+callbacks.final._target_=preemption_callbacks.FinalParameters", f"+callbacks.final.path={folder / name}.pt",
             "+callbacks.pids._target_=preemption_callbacks.Pids", f"+callbacks.pids.folder={folder / 'pids'}"]
    if signal_at:
        added += ["+callbacks.signal._target_=preemption_callbacks.SignalAt", f"+callbacks.signal.marker={folder / 'signalled'}"]
        added += [f"+callbacks.signal.{key}={value}" for key, value in signal_at.items()]
    return added


def last_line(proc: subprocess.CompletedProcess) -> str:
    """The last line of the run's log (standard output; warnings go to standard error)."""
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return lines[-1] if lines else ""
