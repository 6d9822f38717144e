"""The staleness rules, driven by a discrete-event simulation of workers of different speeds."""

from __future__ import annotations

import heapq
import math

import pytest

from lightning_hybrid.parameter_server.sync_controller import SyncController, validate_staleness


def simulate(controller: SyncController, step_times: list[float], iterations_per_epoch: int, epochs: int = 1):
    """Workers with fixed step times take iterations from a shared pool, as the real server deals them.

    Returns per-epoch iteration counts per worker and the largest gap the controller recorded.
    Every event goes through the controller exactly as the parameter server feeds it.
    """
    n = len(step_times)
    counts = []
    now = 0.0
    for _ in range(epochs):
        remaining = iterations_per_epoch
        done = [0] * n
        events = []  # (time a worker finishes its current iteration, worker)
        for w in range(n):
            if remaining:
                remaining -= 1
                heapq.heappush(events, (now + step_times[w], w))
        finished = set()
        while events:
            now, w = heapq.heappop(events)
            done[w] += 1
            decision = controller.push(w)
            released = list(decision.release)
            while released:
                r = released.pop()
                if remaining:
                    remaining -= 1
                    heapq.heappush(events, (now + step_times[r], r))
                else:
                    finished.add(r)
                    released += controller.finish(r).release
            assert len(finished) + len(events) + len(controller.held) == n
        assert controller.all_finished
        controller.new_epoch()
        counts.append(done)
    return counts, controller.max_gap


@pytest.mark.parametrize("mode", ["delay", "bounded"])
@pytest.mark.parametrize("staleness", [1, 2, 3, 5])
def test_gap_never_exceeds_staleness_with_a_3x_straggler(mode, staleness):
    controller = SyncController(3, staleness, mode)
    counts, max_gap = simulate(controller, [1.0, 1.1, 3.0], iterations_per_epoch=300, epochs=2)
    assert max_gap <= staleness
    assert all(sum(c) == 300 for c in counts)


def test_delay_mode_fast_worker_does_more_iterations():
    counts, _ = simulate(SyncController(2, 3, "delay"), [1.0, 3.0], iterations_per_epoch=400)
    fast, slow = counts[0]
    assert fast > 2 * slow  # resets let it run 3 iterations per slow one


def test_bounded_mode_keeps_clocks_within_staleness_for_good():
    # No reset: under a persistent straggler the fast worker stays at most s iterations ahead.
    counts, _ = simulate(SyncController(2, 3, "bounded"), [1.0, 3.0], iterations_per_epoch=400)
    fast, slow = counts[0]
    assert 0 < fast - slow <= 3


def test_delay_mode_resets_after_global_sync():
    c = SyncController(2, 2, "delay")
    assert c.push(0).release == [0]  # gap 1 < 2: go on
    d = c.push(0)  # gap 2: wait until worker 1 finishes its iteration
    assert d.release == [] and c.sync_pending
    d = c.push(1)
    assert d.global_sync and d.release == [0, 1]
    assert c.clocks == [0, 0] and c.global_syncs == 1


def test_bounded_mode_never_resets():
    c = SyncController(2, 1, "bounded")
    assert c.push(0).release == [0]  # clock 1, slowest 0: gap 1 <= 1
    assert c.push(0).release == []  # clock 2: gap 2 > 1, held
    assert c.push(1).release == [0, 1]  # slowest reaches 1: both may go on
    assert c.clocks == [2, 1]


def test_bsp_averages_one_round():
    c = SyncController(3, 0, "delay")
    assert c.push(0).release == [] and c.push(2).release == []
    d = c.push(1)
    assert d.apply_round and d.release == [0, 1, 2]


def test_bsp_round_completes_without_finished_workers():
    c = SyncController(2, 0, "bounded")
    assert c.push(0).release == []
    d = c.finish(1)
    assert d.apply_round and d.release == [0]


def test_inf_never_waits():
    c = SyncController(2, math.inf, "delay")
    for _ in range(100):
        assert c.push(0).release == [0]
    assert c.max_gap == 100


def test_finishing_worker_releases_the_held():
    c = SyncController(2, 1, "bounded")
    c.push(0)
    assert c.push(0).release == []
    assert c.finish(1).release == [0]


@pytest.mark.parametrize("bad", [-1, 1.5, "x", float("nan"), None, True])
def test_bad_staleness(bad):
    with pytest.raises(ValueError, match="staleness must be a non-negative integer or inf"):
        validate_staleness(bad, "delay")


def test_bad_mode_and_string_inf():
    with pytest.raises(ValueError, match="unknown sync mode 'fast'"):
        validate_staleness(3, "fast")
    assert validate_staleness("inf", "bounded") == math.inf
    assert validate_staleness(".inf", "bounded") == math.inf  # YAML's spelling


@pytest.mark.parametrize(
    "staleness, mode, pushes, released, flags",
    [
        (0, "delay", [0, 2], [0, 2], {"global_sync": True, "apply_round": True}),  # the round no longer waits for 1
        (2, "delay", [0, 0, 2], [0, 2], {"global_sync": True}),  # the pending sync no longer waits for 1
        (1, "bounded", [0, 0, 2], [0], {}),  # 1 was the slowest: the bound now counts from 2
    ],
)
def test_a_removed_worker_holds_nobody_back(staleness, mode, pushes, released, flags):
    c = SyncController(3, staleness, mode)
    for w in pushes:
        c.push(w)
    assert c.held == set(released)  # waiting for worker 1, which will never push again
    decision = c.remove(1)
    assert decision.release == released
    assert all(getattr(decision, name) == value for name, value in flags.items())
    assert c.live == {0, 2} and not c.held
    for w in (0, 2):
        c.finish(w)
    assert c.all_finished
    c.new_epoch()
    assert c.active == {0, 2}
