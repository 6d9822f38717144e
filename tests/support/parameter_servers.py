"""Real parameter-server processes for the tests that play the workers themselves (one thread per worker, each
with its own rank on the side channel), started as the strategies start them: one server
(:func:`running_server`) or several shards (:func:`sharded_servers`); and the optimizer the exact-arithmetic
checks replay (:func:`make_optimizer`, :func:`reference_apply`)."""

from __future__ import annotations

import contextlib
import socket
import threading

import torch
import torch.distributed as dist

from lightning_hybrid.parameter_server.channel import ChannelClosedError, open_channel
from lightning_hybrid.parameter_server.client import ParameterServerClient
from lightning_hybrid.parameter_server.protocol import ServerSettings
from lightning_hybrid.parameter_server.server_process import start_server
from lightning_hybrid.parameter_server.sharding import ShardedClient, plan_shards


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(staleness, sync, bulk_dtype=torch.float32, **settings):
    """A server process for 2 workers, started as SSPStrategy starts it; yields (client0, client1, process).
    Ends it unless the test did (and waited for the process)."""
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    proc = start_server(ServerSettings("127.0.0.1", port, "t/", workers=2, staleness=staleness, sync=sync, timeout=30,
                                       **settings))
    pgs = [None, None]

    def join(rank):
        pgs[rank] = open_channel("127.0.0.1", port, "t/", rank + 1, 3, 30)

    threads = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    clients = (ParameterServerClient(pgs[0], 0, bulk_dtype), ParameterServerClient(pgs[1], 1, bulk_dtype))
    yield (*clients, proc)
    if proc.poll() is None:
        try:
            clients[0].shutdown()
        except ChannelClosedError:
            assert proc.wait(timeout=10) != 0, "the server closed the channel without failing"
        proc.wait(timeout=10)
    del store


def make_optimizer():
    params = [torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0])), torch.nn.Parameter(torch.tensor([[0.5]]))]
    return params, torch.optim.SGD(params, lr=0.1, momentum=0.9)


def reference_apply(grads_in_order):
    params, opt = make_optimizer()
    for flat in grads_in_order:
        params[0].grad, params[1].grad = flat[:3].clone(), flat[3:].reshape(1, 1).clone()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in params])


def two_async_pushes(c0, c1) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Worker 0 sends the optimizer and pushes, then worker 1 pushes a gradient computed on the
    initial parameters (one update behind): checks both replies; the gradients, worker 0's buffer."""
    _, optimizer = make_optimizer()
    assert c0.init(optimizer) == 4
    out0, out1 = torch.empty(4), torch.empty(4)
    g = [torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([-1.0, 0.5, 0.0, 2.0]), torch.tensor([0.3, 0.3, 0.3, 0.3])]
    info = c0.push(g[0], [0.1], out0)
    assert info.version == 1 and info.staleness == 0
    info = c1.push(g[1], [0.1], out1)
    assert info.version == 2 and info.staleness == 1
    torch.testing.assert_close(out1, reference_apply(g[:2]))
    return g, out0


@contextlib.contextmanager
def sharded_servers(shards, staleness, shared_memory, sizes=(3, 1), **rule):
    """``shards`` server processes for 2 workers over tensors of ``sizes`` values (``rule``: more
    ServerSettings); yields the two workers' ShardedClients, or with one shard their plain clients
    (as a strategy's workers get them)."""
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    plan = plan_shards(list(sizes), shards)
    settings = [ServerSettings("127.0.0.1", port, f"s{i}/", workers=2, staleness=staleness, timeout=30,
                               num_params=stop - start, shard=i, shards=shards, **rule)
                for i, (start, stop) in enumerate(plan.values)]
    procs = [start_server(s) for s in settings]
    pgs = {}

    def join(worker, shard):
        pgs[worker, shard] = open_channel("127.0.0.1", port, settings[shard].prefix, worker + 1, 3, 30)

    threads = [threading.Thread(target=join, args=(w, s)) for w in (0, 1) for s in range(shards)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    clients = [[ParameterServerClient(pgs[w, s], w, server_name=settings[s].name) for s in range(shards)] for w in (0, 1)]
    clients = [c[0] if shards == 1 else ShardedClient(c, plan) for c in clients]
    if shared_memory:
        assert [c.attach_shared_memory(sum(sizes)) for c in clients] == ["shared_memory"] * 2
    yield clients
    load = clients[0].shutdown()
    assert [p.wait(timeout=10) for p in procs] == [0] * shards
    if shards > 1:
        assert load.pushes == clients[0].shard_loads[1].pushes
    del store
