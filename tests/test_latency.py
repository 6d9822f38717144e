"""The simulated collective latency (lightning_hybrid.sim.latency) on a one-process gloo group: a
collective completes L after its data without blocking its caller, and a future's callback may wait for
a later collective (torch's PowerSGD hook does so) without deadlocking the timer."""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.distributed as dist

from lightning_hybrid.sim.latency import CollectiveLatency


@pytest.fixture
def one_process_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_collective_completes_after_the_latency_and_its_caller_goes_on(one_process_group):
    latency = CollectiveLatency(0.2).install()
    try:
        start = time.monotonic()
        work = dist.all_reduce(torch.ones(4), async_op=True)
        returned = time.monotonic() - start
        work.wait()
        completed = time.monotonic() - start
        dist.all_reduce(torch.ones(4))  # synchronous: returns once delayed
        synchronous = time.monotonic() - start - completed
    finally:
        latency.uninstall()
    assert returned < 0.1 and completed >= 0.19 and synchronous >= 0.19, (returned, completed, synchronous)
    assert latency.delayed == 2


def test_a_callback_that_waits_for_another_collective_completes(one_process_group):
    """PowerSGD's pattern: all_reduce(...).get_future().then(lambda f: all_reduce(...).get_future().wait())."""
    latency = CollectiveLatency(0.05).install()
    try:
        def second(future: torch.futures.Future) -> torch.Tensor:
            return dist.all_reduce(future.value()[0] * 2, async_op=True).get_future().wait()[0]

        chained = dist.all_reduce(torch.ones(3), async_op=True).get_future().then(second)
        result: list[torch.Tensor] = []
        waiter = threading.Thread(target=lambda: result.append(chained.wait()), daemon=True)
        waiter.start()
        waiter.join(timeout=10)
    finally:
        latency.uninstall()
    assert result, "the chained collective never completed: the latency's timer waited on itself"
    assert torch.equal(result[0], torch.full((3,), 2.0))
