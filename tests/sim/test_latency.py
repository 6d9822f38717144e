"""The simulated collective latency (lightning_hybrid.sim.latency) on a two-rank gloo group: a collective
completes its message steps' round trips after its data without blocking its caller, a group runs as many
at once as gloo does (two), and a future's callback may wait for a later collective (torch's PowerSGD hook
does so) without deadlocking the timer."""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_hybrid.comm.regime import IN_FLIGHT, measure_link, round_trips
from lightning_hybrid.sim.latency import CollectiveLatency

RTT = 0.1


def test_round_trips_follow_the_algorithms_message_steps():
    assert round_trips("all_reduce", 2, 62000) == 2  # reduce-scatter, all-gather: a round trip each under gloo
    assert round_trips("all_reduce", 2, 1) == 1  # one value: nothing to scatter
    assert round_trips("all_reduce", 4, 1000) == 6
    assert round_trips("broadcast", 2, 1) == 1 and round_trips("broadcast", 8, 1) == 3
    assert round_trips("all_gather", 4, 10) == 3 and round_trips("barrier", 2, None) == 1
    assert round_trips("all_reduce", 2, 62000, backend="nccl") == 1  # no rendezvous: a one-way latency a step
    assert round_trips("all_reduce", 1, 10) == 0
    assert IN_FLIGHT == {"gloo": 2, "nccl": 1}


def _timings(rank: int, rendezvous: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    measured = {}
    latency = CollectiveLatency(RTT).install()
    try:
        dist.barrier()
        start = time.monotonic()
        work = dist.all_reduce(torch.ones(4), async_op=True)
        measured["returned"] = time.monotonic() - start
        work.wait()
        measured["all_reduce"] = time.monotonic() - start
        start = time.monotonic()
        dist.broadcast(torch.ones(1), 0)  # synchronous: returns once delayed
        measured["broadcast"] = time.monotonic() - start
        for count in (2, 4):
            dist.barrier()
            start = time.monotonic()
            for work in [dist.all_reduce(torch.ones(4), async_op=True) for _ in range(count)]:
                work.wait()
            measured[f"at_once_{count}"] = time.monotonic() - start

        def second(future: torch.futures.Future) -> torch.Tensor:  # PowerSGD's pattern
            return dist.all_reduce(future.value()[0] * 2, async_op=True).get_future().wait()[0]

        chained = dist.all_reduce(torch.ones(3), async_op=True).get_future().then(second)
        result: list[torch.Tensor] = []
        waiter = threading.Thread(target=lambda: result.append(chained.wait()), daemon=True)
        waiter.start()
        waiter.join(timeout=10)
        measured["chained"] = result[0].tolist() if result else None
    finally:
        latency.uninstall()
    unlimited = CollectiveLatency(RTT, in_flight=0).install()
    try:
        dist.barrier()
        start = time.monotonic()
        for work in [dist.all_reduce(torch.ones(4), async_op=True) for _ in range(4)]:
            work.wait()
        measured["unlimited_4"] = time.monotonic() - start
    finally:
        unlimited.uninstall()
    rated = CollectiveLatency(RTT, bytes_per_s=1e6).install()  # 1 MB/s: 100,000 values send 400 KB a rank
    try:
        dist.barrier()
        start = time.monotonic()
        dist.all_reduce(torch.zeros(100_000))
        measured["rated"] = time.monotonic() - start
        measured["link"] = measure_link(100_000)  # what the straggler report reads: the simulated link
    finally:
        rated.uninstall()
    measured["delayed"] = latency.delayed
    results[rank] = measured
    dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_collectives_take_their_round_trips_two_at_a_time(tmp_path):
    results = mp.Manager().dict()
    mp.start_processes(_timings, args=(str(tmp_path / "rendezvous"), results), nprocs=2, start_method="forkserver")
    for rank, m in results.items():
        assert m["returned"] < 0.05, (rank, m)  # the caller goes on
        assert 2 * RTT * 0.95 <= m["all_reduce"] < 2 * RTT + 0.08, (rank, m)  # two steps: two round trips
        assert RTT * 0.95 <= m["broadcast"] < RTT + 0.08, (rank, m)
        assert 2 * RTT * 0.95 <= m["at_once_2"] < 2 * RTT + 0.08, (rank, m)  # gloo's two threads: side by side
        assert 4 * RTT * 0.95 <= m["at_once_4"] < 4 * RTT + 0.1, (rank, m)  # the third and fourth wait for a slot
        assert m["unlimited_4"] < 2 * RTT + 0.08, (rank, m)  # in_flight=0: every latency at once
        assert m["chained"] == [8.0, 8.0, 8.0], "the chained collective never completed: the timer waited on itself"
        assert 2 * RTT + 0.4 <= m["rated"] < 2 * RTT + 0.4 + 0.1, (rank, m)  # two round trips and 400 KB at 1 MB/s
        round_trip, rate = m["link"]
        assert RTT * 0.95 <= round_trip < RTT * 1.3, (rank, m)  # a one-value all-reduce: one round trip
        assert 0.85e6 < rate < 1.05e6, (rank, m)  # 400 KB at 1 MB/s beside its 2 round trips
        assert m["delayed"] == 13, (rank, m)  # 3 barriers, 8 all-reduces, a broadcast, the chained one


def _lanes(rank: int, rendezvous: str, results) -> None:
    from lightning_hybrid.comm.delayed_allreduce import DelayedAllReduce

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    param = torch.nn.Parameter(torch.zeros(8))
    groups = [dist.new_group(backend="gloo") for _ in range(2)]
    latency = CollectiveLatency(RTT).install()
    measured = {}
    try:
        for name, lanes in (("one group", groups[:1]), ("two lanes", groups)):
            exchange = DelayedAllReduce([param], delay=4, group=lanes)
            dist.barrier()
            start = time.monotonic()
            for _ in range(8):  # a step that takes no time, its exchange 4 steps deep
                param.grad = torch.full((8,), float(rank))
                exchange.push()
                exchange.pop_ready()
            while exchange.pop_oldest() is not None:
                pass
            measured[name] = time.monotonic() - start
    finally:
        latency.uninstall()
    results[rank] = measured
    dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_lanes_run_more_exchanges_at_once_than_one_group(tmp_path):
    """8 exchanges of 2 round trips each: one gloo group runs two at once (4 x 2 round trips), two lanes
    four (2 x 2 round trips), what a delay of 4 needs to overlap them all."""
    results = mp.Manager().dict()
    mp.start_processes(_lanes, args=(str(tmp_path / "rendezvous"), results), nprocs=2, start_method="forkserver")
    for rank, m in results.items():
        assert 8 * RTT * 0.95 <= m["one group"] < 8 * RTT + 0.2, (rank, m)
        assert 4 * RTT * 0.95 <= m["two lanes"] < 4 * RTT + 0.2, (rank, m)
