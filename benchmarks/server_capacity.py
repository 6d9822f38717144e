"""How many workers one parameter server can serve: its CPU time per push, against a worker's.

Starts the real server process (as SSPStrategy does) for ``--workers`` worker processes that push
gradients of ``--params`` float32 values as fast as they can (no model: the server's side of a
push only), fully asynchronous, and reads the server's own report at shutdown
(:class:`~lightning_hybrid.parameter_server.load.ServerLoad`): its CPU time per push. Beside it,
LeNet-5's forward and backward pass on a batch of 64 MNIST-sized images on one core: the time a
worker takes per push. Their ratio is the number of LeNet-5 workers that would keep one server's
CPU busy all the time.

Each row runs with one transport (``--transports``): ``shared_memory``, each worker's gradients
and parameters through a segment in /dev/shm (SSPStrategy's ``transport="auto"`` on one host), or
``channel``, through the gloo side channel (workers on other hosts, ``transport="channel"``). Beside
the server's time per push, the floor measured in the same run on one core: the gradient copied in,
the optimizer's step (SGD with momentum; one per ``workers`` pushes, the default update rule, so a
push's share of it), the parameters copied out: what a push cannot cost less than on one core,
whatever the transport.

Three sizes or more separate what a push costs per value (copying, the optimizer: the slope
between the two largest) from what it costs per message (headers, wake-ups, Python: the rest of the
smallest one's cost). Sharding the parameters over ``k`` servers divides only the per-value part:
every shard still receives and answers every push.

    python benchmarks/server_capacity.py --workers 1 2 --params 61706 1000000 4000000 --pushes 400
    python benchmarks/server_capacity.py --workers 1 --params 1000000 4000000 16000000 33600000 --pushes 40
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import time

import torch
import torch.distributed as dist

from lightning_hybrid.models import LeNet5
from lightning_hybrid.parameter_server.channel import open_channel
from lightning_hybrid.parameter_server.client import ParameterServerClient
from lightning_hybrid.parameter_server.load import ServerLoad
from lightning_hybrid.parameter_server.protocol import ServerSettings
from lightning_hybrid.parameter_server.server_process import start_server
from lightning_hybrid.parameter_server.sharding import ShardedClient, plan_shards

#: The benchmark's model: its parameters in this many tensors of about equal size (what shards split).
TENSORS = 8


LENET5_PARAMS = sum(p.numel() for p in LeNet5().parameters())  # 61,706


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tensor_sizes(params: int) -> list[int]:
    """The benchmark model's tensors: ``params`` values in :data:`TENSORS` tensors."""
    return [params // TENSORS + (i < params % TENSORS) for i in range(TENSORS)]


def worker(port: int, rank: int, workers: int, params: int, pushes: int, transport: str, shards: int, ready,
           results) -> None:
    torch.set_num_threads(1)
    plan = plan_shards(tensor_sizes(params), shards)
    clients = [ParameterServerClient(open_channel("127.0.0.1", port, f"cap{i}/", rank + 1, workers + 1, 60), rank)
               for i in range(shards)]
    client = clients[0] if shards == 1 else ShardedClient(clients, plan)
    if transport == "shared_memory" and client.attach_shared_memory(params) != "shared_memory":
        raise RuntimeError("no shared memory with the server (see the warning above)")
    out = torch.empty(params)
    if rank == 0:
        weights = [torch.nn.Parameter(torch.zeros(n)) for n in tensor_sizes(params)]
        client.init(torch.optim.SGD(weights, lr=0.01, momentum=0.9))
    ready.wait()
    grad = torch.randn(params) * 1e-3
    start = time.perf_counter()
    for _ in range(pushes):
        client.push(grad, [0.01], out)
    results.put((rank, time.perf_counter() - start))
    ready.wait()  # every worker is done pushing before worker 0 ends the server
    if rank == 0:
        load = client.shutdown()
        results.put(("load", (load, getattr(client, "shard_loads", [load]))))
    ready.wait()  # a worker that leaves while a server still serves reads to it as one that died


def measure(workers: int, params: int, pushes: int, transport: str,
            shards: int = 1) -> tuple[ServerLoad, list[ServerLoad], float]:
    """The servers' load together and each shard's, and the pushes per second all workers together got through."""
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    # SSPStrategy's default update rule: one step per push of each worker, staleness-weighted, momentum corrected
    plan = plan_shards(tensor_sizes(params), shards)
    servers = [
        start_server(ServerSettings("127.0.0.1", port, f"cap{i}/", workers=workers, staleness=float("inf"), timeout=60,
                                    pushes_per_update=workers, staleness_lr=True, momentum_correction=True,
                                    restart_steps=10, num_params=stop - start, shard=i, shards=shards))
        for i, (start, stop) in enumerate(plan.values)
    ]
    ctx = mp.get_context("spawn")
    ready, results = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(port, r, workers, params, pushes, transport, shards, ready, results)) for r in range(workers)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=600) for _ in range(workers + 1))
    for p in procs:
        p.join(timeout=60)
    for server in servers:
        server.wait(timeout=60)
    del store
    slowest = max(v for k, v in got.items() if k != "load")
    load, shard_loads = got["load"]
    return load, shard_loads, workers * pushes / slowest


def lenet5_seconds_per_batch(batch: int = 64, repeats: int = 30) -> float:
    """Median time of LeNet-5's forward and backward pass on one core (a worker's time per push)."""
    torch.set_num_threads(1)
    net, x, y = LeNet5(), torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
    times = []
    for _ in range(repeats + 5):
        start = time.perf_counter()
        net.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times[5:])


def floor_ms(params: int, repeats: int = 7) -> tuple[float, float, float]:
    """What a push cannot cost less than on one core: ``(copy in, optimizer step, copy out)`` in ms,
    medians: a gradient of ``params`` float32 values copied into place, SGD with momentum's step
    (the benchmark's optimizer), the parameters copied out."""
    torch.set_num_threads(1)
    flat, grads = torch.zeros(params), torch.zeros(params)  # the server's layout: views of one flat buffer each
    weights, offset = [], 0
    for n in tensor_sizes(params):
        weight = torch.nn.Parameter(flat[offset : offset + n])
        weight.grad = grads[offset : offset + n]
        weights.append(weight)
        offset += n
    optimizer = torch.optim.SGD(weights, lr=0.01, momentum=0.9)
    incoming, outgoing = torch.randn(params) * 1e-3, torch.empty(params)
    parts: list[tuple[float, float, float]] = []
    for _ in range(repeats + 1):  # the first allocates the momentum buffer
        t0 = time.perf_counter()
        grads.copy_(incoming)
        t1 = time.perf_counter()
        optimizer.step()
        t2 = time.perf_counter()
        outgoing.copy_(flat)
        t3 = time.perf_counter()
        parts.append((t1 - t0, t2 - t1, t3 - t2))
    return tuple(1e3 * statistics.median(p[i] for p in parts[1:]) for i in range(3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--params", type=int, nargs="+", default=[LENET5_PARAMS, 1_000_000, 4_000_000])
    parser.add_argument("--pushes", type=int, default=400, help="pushes per worker")
    parser.add_argument("--transports", nargs="+", choices=("shared_memory", "channel"), default=["shared_memory", "channel"])
    parser.add_argument("--shards", type=int, nargs="+", default=[1], help="server shards (SSPStrategy's servers)")
    args = parser.parse_args()

    worker_s = lenet5_seconds_per_batch()
    print(f"LeNet-5 forward + backward, batch 64, one core: {1e3 * worker_s:.2f} ms (a worker's time per push)\n")
    print("| workers | transport | shards | parameters | pushes/s (all workers) | server CPU per push (ms, all shards) | "
          "slowest shard's CPU per push (ms) | floor (ms): in + step + out | server / floor | server busy | "
          "LeNet-5 workers to saturate the server |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    floors = {params: floor_ms(params) for params in args.params}
    per_size: dict[int, list[float]] = {}
    rates: dict[tuple[str, int, int, int], float] = {}
    for transport in args.transports:
        for shards in args.shards:
            for workers in args.workers:
                for params in args.params:
                    load, shard_loads, rate = measure(workers, params, args.pushes, transport, shards)
                    rates[transport, shards, workers, params] = rate
                    if transport == args.transports[0] and shards == args.shards[0]:
                        per_size.setdefault(params, []).append(load.cpu_ms_per_push)
                    saturate = f"{load.workers_to_saturate(worker_s):.0f}" if params == LENET5_PARAMS else "-"
                    # a step per pushes_per_update (= workers) pushes: each push pays its share of one
                    parts = (floors[params][0], floors[params][1] * load.steps / max(load.pushes, 1), floors[params][2])
                    floor = sum(parts)
                    slowest = max(s.cpu_ms_per_push for s in shard_loads)
                    print(f"| {workers} | {transport} | {shards} | {params:,} | {rate:.0f} | {load.cpu_ms_per_push:.3f} | "
                          f"{slowest:.3f} | {floor:.3f}: {parts[0]:.3f} + {parts[1]:.3f} + {parts[2]:.3f} | "
                          f"{load.cpu_ms_per_push / floor:.2f} | {100 * load.busy_fraction:.0f} % | {saturate} |",
                          flush=True)
    one = min(args.shards)
    for transport, shards, workers, params in rates:
        if shards != one:
            ratio = rates[transport, shards, workers, params] / rates[transport, one, workers, params]
            print(f"{shards} shards / {one}: {ratio:.2f}x the pushes per second ({transport}, {workers} worker(s), "
                  f"{params:,} parameters)")
    if len(per_size) >= 3:
        print(f"\n({args.transports[0]}:)")
        sizes = sorted(per_size)
        cost = {p: statistics.median(per_size[p]) for p in sizes}
        # The per-value part from the two largest models, the rest of the smallest's cost is per message.
        per_value = (cost[sizes[-1]] - cost[sizes[-2]]) / (sizes[-1] - sizes[-2])
        per_message = cost[sizes[0]] - per_value * sizes[0]
        print(f"\nserver CPU per push ~ {per_message:.3f} ms per message + {1e6 * per_value:.3f} ms per million parameters")
        if LENET5_PARAMS in cost:
            # Every shard receives and answers every push: k shards divide the per-value part only.
            for k in (1, 2, 4):
                shard = per_message + per_value * LENET5_PARAMS / k
                print(f"  {k} server(s), LeNet-5: {shard:.3f} ms per push on each -> "
                      f"{1e3 * worker_s / shard:.0f} LeNet-5 workers to saturate them")


if __name__ == "__main__":
    main()
