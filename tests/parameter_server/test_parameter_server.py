"""The parameter-server process and its client, without Lightning: exact arithmetic and holds.

The test process plays both workers (one thread each, each with its own rank on the side
channel) against a real server process started the way SSPStrategy starts it.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from lightning_hybrid.parameter_server.client import DatasetShape
from parameter_servers import make_optimizer, reference_apply, running_server, two_async_pushes

pytestmark = pytest.mark.multiprocess


@pytest.fixture
def server(request):
    """Start a server for 2 workers; yield (client0, client1)."""
    staleness, sync, *rule = request.param
    with running_server(staleness, sync, **(rule[0] if rule else {})) as (c0, c1, _):
        yield c0, c1


def push_in_thread(client, grad, out):
    result = {}

    def run():
        result["info"] = client.push(grad, [0.1], out)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


@pytest.mark.parametrize("server", [(float("inf"), "delay")], indirect=True)
def test_async_applies_each_gradient_once_in_arrival_order(server):
    c0, c1 = server
    g, out0 = two_async_pushes(c0, c1)
    c0.push(g[2], [0.1], out0)
    torch.testing.assert_close(out0, reference_apply(g))
    # the optimizer state (momentum) is the server's
    state = c0.optimizer_state()
    assert len(state["state"]) == 2 and state["state"][0]["momentum_buffer"].abs().sum() > 0


@pytest.mark.parametrize("server", [(1, "delay")], indirect=True)
def test_delay_mode_holds_the_fast_worker_until_the_global_sync(server):
    c0, c1 = server
    _, optimizer = make_optimizer()
    c0.init(optimizer)
    out0, out1 = torch.empty(4), torch.empty(4)
    g0, g1 = torch.ones(4), torch.full((4,), 2.0)
    thread, result = push_in_thread(c0, g0, out0)
    time.sleep(0.5)
    assert thread.is_alive(), "worker 0 is one iteration ahead with staleness 1: it must wait"
    info1 = c1.push(g1, [0.1], out1)
    thread.join(timeout=10)
    assert not thread.is_alive()
    expected = reference_apply([g0, g1])
    torch.testing.assert_close(out0, expected)
    torch.testing.assert_close(out1, expected)  # the global sync: both hold the same parameters
    assert result["info"].global_syncs == info1.global_syncs == 1


@pytest.mark.parametrize("server", [(0, "delay")], indirect=True)
def test_bsp_averages_the_round_and_deals_static_chunks(server):
    c0, c1 = server
    _, optimizer = make_optimizer()
    c0.init(optimizer)
    shape = DatasetShape(num_samples=8, batch_size=2, seed=4)
    order = torch.randperm(8, generator=torch.Generator().manual_seed(4 + 0))
    assert c1.next_chunk(0, shape)[0].tolist() == order[2:4].tolist()  # worker 1's first chunk is chunk 1
    assert c0.next_chunk(0, shape)[0].tolist() == order[0:2].tolist()
    out0, out1 = torch.empty(4), torch.empty(4)
    g0, g1 = torch.ones(4), torch.full((4,), 3.0)
    thread, _ = push_in_thread(c0, g0, out0)
    c1.push(g1, [0.1], out1)
    thread.join(timeout=10)
    expected = reference_apply([(g0 + g1) / 2])
    torch.testing.assert_close(out0, expected)
    torch.testing.assert_close(out1, expected)


@pytest.mark.parametrize("server", [(2, "bounded")], indirect=True)
def test_server_reports_bad_requests(server):
    c0, _ = server
    with pytest.raises(RuntimeError, match="refused PUSH from worker 0: RuntimeError: worker 0 needs the optimizer"):
        c0.push(torch.zeros(4), [0.1], torch.empty(4))


@pytest.mark.parametrize("server", [(float("inf"), "bounded")], indirect=True)
def test_next_batch_travels_with_the_parameters(server):
    c0, _ = server
    _, optimizer = make_optimizer()
    c0.init(optimizer)
    shape = DatasetShape(num_samples=6, batch_size=2, seed=1)
    order = torch.randperm(6, generator=torch.Generator().manual_seed(1 + 3)).tolist()
    assert c0.next_chunk(3, shape)[0].tolist() == order[0:2]  # the first request of epoch 3 starts it
    out = torch.empty(4)
    info = c0.push(torch.zeros(4), [0.1], out, next_chunk_of_epoch=3)
    assert info.chunk.tolist() == order[2:4] and not info.epoch_over
    info = c0.push(torch.zeros(4), [0.1], out, next_chunk_of_epoch=3)
    assert info.chunk.tolist() == order[4:6]
    info = c0.push(torch.zeros(4), [0.1], out, next_chunk_of_epoch=3)
    assert info.chunk is None and info.epoch_over
    info = c0.push(torch.zeros(4), [0.1], out)  # not asked for: neither a batch nor an end
    assert info.chunk is None and not info.epoch_over


@pytest.mark.parametrize("server", [(float("inf"), "delay", dict(pushes_per_update=2, staleness_lr=True, max_steps=2))],
                         indirect=True)
def test_pushes_averaged_into_steps_stale_ones_weighted_and_max_steps_stops(server):
    c0, c1 = server
    _, optimizer = make_optimizer()
    c0.init(optimizer)
    out0, out1 = torch.empty(4), torch.empty(4)
    g = [torch.ones(4), torch.full((4,), 3.0), torch.full((4,), 2.0), torch.full((4,), 8.0)]
    assert c0.push(g[0], [0.1], out0).version == 0  # one of two pushes: no step yet
    info = c1.push(g[1], [0.1], out1)
    assert info.version == 1 and not info.stop
    torch.testing.assert_close(out1, reference_apply([(g[0] + g[1]) / 2]))
    c0.push(g[2], [0.1], out0, read_version=1)
    info = c1.push(g[3], [0.1], out1, read_version=0)  # computed at step 0: one step stale
    assert info.staleness == 1 and info.version == 2 and info.stop  # the second step was the last
    torch.testing.assert_close(out1, reference_apply([(g[0] + g[1]) / 2, (g[2] + g[3]) / 2]))
    after = c0.push(torch.full((4,), 100.0), [0.1], out0)
    assert after.stop and after.version == 2  # nothing more is applied
    torch.testing.assert_close(out0, out1)


def test_a_large_model_pushed_right_after_init_and_the_load_reported_at_shutdown():
    # 300,000 parameters do not fit the receive buffers the server posts before Init arrives
    # (about 131,000 values); ServerSettings.num_params sizes them from the start.
    numel = 300_000
    with running_server(float("inf"), "delay", num_params=numel) as (c0, c1, proc):
        weights = torch.nn.Parameter(torch.zeros(numel))
        c0.init(torch.optim.SGD([weights], lr=0.5))
        out0, out1 = torch.empty(numel), torch.empty(numel)
        c0.push(torch.ones(numel), [0.5], out0)  # the first step: not measured (start-up, lazy imports)
        c1.push(torch.full((numel,), 2.0), [0.5], out1)  # worker 1's first message at all
        c0.push(torch.ones(numel), [0.5], out0)
        torch.testing.assert_close(out0, torch.full((numel,), -2.0))  # 0 - 0.5 * (1 + 2 + 1)
        load = c0.shutdown()
        assert proc.wait(timeout=10) == 0
    assert (load.pushes, load.steps) == (2, 2)  # after the first step
    assert 0 < load.busy_s <= load.wall_s and load.cpu_s > 0 and load.cpu_ms_per_push > 0
