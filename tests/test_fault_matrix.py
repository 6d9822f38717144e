"""The fault matrix: a stop signal at any moment of a run, under every strategy, is one orderly stop.

For each strategy one command is run again and again in the same folder, as a preempted job is
requeued; each run meets the next case of :data:`preemption_callbacks.CASES` (a signal during set-up,
in the sanity check, in validation, while a checkpoint is written, to rank 1 alone, twice in a row,
during ``trainer.test``), and the last run finishes. Each stop: every process gone within 10 s of the
signal, exit status 128 + the signal, the run's last line saying what stopped it, no traceback, no
process or shared-memory segment left, no half-written checkpoint; the next run resumes from the
stop's checkpoint or, where nothing was trained yet, says that it starts over. The finished run ends
with the parameters of the same command run without a fault. ``docs/faults.md`` has the table.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import torch

from conftest import alive
from leftovers import shared_memory_left
from preemption_callbacks import CASES
from preemption_runs import STRATEGIES, callbacks, last_line, run

pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc (Linux)")]

#: What each case's stop says and exits with, and whether the next run resumes from a checkpoint.
SIGNAL = {case: ("SIGUSR2" if case == "twice" else "SIGTERM") for case in CASES}
BEFORE_TRAINING = ("setup", "sanity")
#: The parameter-server strategies keep no mid-epoch state: a stop in epoch 0 (validation) has no
#: epoch-end checkpoint to resume from yet.
EPOCH_END_ONLY = ("ssp", "cneural")


def fault_callbacks(folder: Path) -> list[str]:
    return ["+callbacks.fault._target_=preemption_callbacks.FaultAt", f"+callbacks.fault.folder={folder / 'faults'}"]


def expected_resume(strategy: str, previous: str | None) -> str | None:
    """What the run after ``previous``'s stop says about where it starts."""
    if previous is None:
        return None
    if previous in BEFORE_TRAINING or (previous == "validation" and strategy in EPOCH_END_ONLY):
        return "starting over" if previous in BEFORE_TRAINING else None
    return "resuming from"


def check_stop(folder: Path, case: str, proc, run_dir: Path) -> None:
    ended = time.time()
    output = proc.stdout + proc.stderr
    signame = SIGNAL[case]
    assert proc.returncode == 128 + signal.Signals[signame], f"{case}: exit status {proc.returncode}:\n{output[-4000:]}"
    assert (folder / "faults" / case).is_file(), f"{case}: the signal was not sent"
    assert ended - float((folder / "faults" / case).read_text()) < 10, f"{case}: every process ends within 10 s"
    line = last_line(proc)
    assert f"stopped by {signame}" in line, f"{case}: last line {line!r}"
    if case in BEFORE_TRAINING:
        assert "before any training" in line, line
    assert "Traceback" not in output, f"{case}:\n{output[-4000:]}"
    pids = {p.name: int(p.read_text()) for p in (folder / "pids").iterdir()}
    assert len(pids) >= 2 and not [name for name, pid in pids.items() if alive(pid)], f"{case}: a process outlived the stop"
    assert shared_memory_left(pids) == [], f"{case}: a shared-memory segment was left"
    assert not list((run_dir / "checkpoints").glob("*.tmp")), f"{case}: a half-written checkpoint"


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_signal_at_any_moment_stops_every_rank_and_the_same_command_resumes(tmp_path, strategy):
    forked = ("strategy.fork_ranks=true",) if strategy == "ssp" else ()  # as the others (ddp: Lightning's launcher)
    settings = (*STRATEGIES[strategy], *forked, "trainer.devices=2", "trainer.num_sanity_val_steps=1", "test=true")
    command = (*settings, f"hydra.run.dir={tmp_path / 'run'}", *callbacks(tmp_path, "resumed"),
               *fault_callbacks(tmp_path))
    previous = None
    for case in CASES:
        proc = run(*command, cwd=tmp_path)
        (tmp_path / f"{case}.log").write_text(proc.stdout + proc.stderr)  # kept by pytest, for a failure's reading
        said = expected_resume(strategy, previous)
        assert said is None or said in proc.stdout + proc.stderr, f"after {previous}: no {said!r}:\n{proc.stdout[-3000:]}"
        check_stop(tmp_path, case, proc, tmp_path / "run")
        previous = case
    finished = run(*command, cwd=tmp_path)
    (tmp_path / "finished.log").write_text(finished.stdout + finished.stderr)
    assert finished.returncode == 0, (finished.stdout + finished.stderr)[-4000:]
    assert "resuming from" in finished.stdout + finished.stderr

    reference = run(*settings, f"hydra.run.dir={tmp_path / 'reference'}", *callbacks(tmp_path, "reference"), cwd=tmp_path)
    assert reference.returncode == 0, (reference.stdout + reference.stderr)[-4000:]
    got, expected = torch.load(tmp_path / "resumed.pt"), torch.load(tmp_path / "reference.pt")
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-5, msg=name)
