"""The server's step wait: each worker's cycle, its waits for the server excluded, decides how long a
push may wait for the update its peers complete."""

from __future__ import annotations

import pytest

from lightning_hybrid.parameter_server.step_wait import StepWaits


def run_cycles(waits: StepWaits, worker: int, start: float, own: float, held: float, cycles: int) -> float:
    """``worker`` works ``own`` seconds, pushes, and gets its reply ``held`` seconds later, ``cycles`` times."""
    t = start
    for _ in range(cycles):
        t += own
        waits.pushed(worker, t)
        t += held
        waits.replied(worker, t)
    return t


def test_waiting_for_the_reply_does_not_lengthen_the_cycle():
    """A fast worker held for most of a cycle each time keeps its own 1 s cycle: no feedback loop in
    which waiting inflates the interval that decides the waiting."""
    waits = StepWaits(workers=2, patience=1.0)
    run_cycles(waits, 0, 0.0, own=1.0, held=0.9, cycles=20)
    assert waits.cycle(0) == pytest.approx(1.0)


def test_a_peer_due_within_the_patience_is_waited_for_and_a_straggler_is_not():
    waits = StepWaits(workers=3, patience=1.0)
    t = run_cycles(waits, 0, 0.0, own=1.0, held=0.0, cycles=3)  # fast: 1 s cycles, replied at t = 3
    run_cycles(waits, 1, 0.0, own=1.2, held=0.0, cycles=2)  # last replied at 2.4: due at 3.6
    run_cycles(waits, 2, 0.0, own=4.0, held=0.0, cycles=1)  # replied at 4.0: due at 8.0
    assert waits.deadline(worker=0, needed=1, peers=[1, 2], now=t) == pytest.approx(t + 1.0)
    assert waits.deadline(worker=0, needed=2, peers=[1, 2], now=t) is None  # the straggler is not due in time
    assert waits.deadline(worker=0, needed=1, peers=[2], now=t) is None


def test_a_global_sync_interrupts_the_cycles():
    """What a worker does after a global sync (validation, the next epoch's start) is not its cycle."""
    waits = StepWaits(workers=2, patience=1.0)
    t = run_cycles(waits, 0, 0.0, own=1.0, held=0.0, cycles=3)
    waits.synchronized()
    waits.pushed(0, t + 60.0)  # a minute of validation later
    assert waits.cycle(0) == pytest.approx(1.0)
    waits.replied(0, t + 60.0)
    waits.pushed(0, t + 61.0)
    assert waits.cycle(0) == pytest.approx(1.0)


def test_no_wait_without_patience_or_a_measured_cycle():
    waits = StepWaits(workers=2, patience=0.0)
    run_cycles(waits, 0, 0.0, own=1.0, held=0.0, cycles=3)
    run_cycles(waits, 1, 0.0, own=1.0, held=0.0, cycles=3)
    assert waits.deadline(worker=0, needed=1, peers=[1], now=3.0) is None
    fresh = StepWaits(workers=2, patience=1.0)
    assert fresh.deadline(worker=0, needed=1, peers=[1], now=0.0) is None
    with pytest.raises(ValueError, match="patience"):
        StepWaits(workers=2, patience=-1.0)
