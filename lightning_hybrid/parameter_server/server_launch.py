"""A run's parameter servers seen from its workers: the options checked, each shard's settings, the
processes started and stopped, and a worker's client to all of them (plain torch).

:class:`~lightning_hybrid.strategies.parameter_server.ParameterServerStrategy` calls these: rank 0
starts the server processes (:func:`start_servers`) and ends them (:func:`stop_servers`), every worker
connects (:func:`connect`) and picks how its tensors travel (:func:`attach_transport`); :func:`shard_settings`
is what each shard is told, alike on every rank, for the number of shards :func:`server_count` decides.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from lightning_hybrid.comm.collectives import broadcast_object
from lightning_hybrid.parameter_server.channel import open_channel
from lightning_hybrid.parameter_server.client import ParameterServerClient
from lightning_hybrid.parameter_server.protocol import WORKER_FAILURE_MODES, ServerSettings, check_server_device
from lightning_hybrid.parameter_server.server_process import run, start_server
from lightning_hybrid.parameter_server.sharding import ShardedClient, ShardPlan, auto_servers, plan_shards
from lightning_hybrid.sim.link import LINK_ENV, in_shaped_link

log = logging.getLogger(__name__)

#: How gradients and parameters reach the server: ``"auto"``, through shared memory for workers on
#: its host (the side channel for the others, or where no segment can be made); ``"channel"``,
#: through the side channel always.
TRANSPORTS = ("auto", "channel")
#: Seconds rank 0 waits, on a stop, for the server to see every worker leave and exit.
SERVER_EXIT_S = 10.0


class ServerProcess(Protocol):
    """What is used of a server process (:class:`subprocess.Popen`, or a forked one)."""

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


def check_options(timeout: float, on_worker_failure: str, transport: str, servers: int | str, server_device: str) -> None:
    """Refuse a parameter-server run's options that cannot work, saying what to give instead (before
    any process starts; ``server_device="auto"`` is decided, and checked, at setup)."""
    if servers != "auto" and (isinstance(servers, bool) or not isinstance(servers, int) or servers < 1):
        raise ValueError(f"servers must be a positive number of server processes or 'auto', got {servers!r}")
    if servers not in (1, "auto") and on_worker_failure == "continue":
        raise ValueError(
            "on_worker_failure='continue' works with one parameter server only (each shard would re-deal a lost "
            f"worker's batches and regroup on its own); got servers={servers!r}. Use servers=1, or "
            "on_worker_failure='stop'."
        )
    if server_device != "auto":  # a bad name or a missing CUDA device is an error now
        check_server_device(server_device)
        resolve_server_device(server_device)
    if transport not in TRANSPORTS:
        raise ValueError(
            f"transport must be 'auto' (shared memory with a server on the same host, else the side channel) or "
            f"'channel' (the side channel always), got {transport!r}"
        )
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
    if on_worker_failure not in WORKER_FAILURE_MODES:
        raise ValueError(
            f"on_worker_failure must be 'stop' (a dead worker ends the run) or 'continue' (the others finish "
            f"its work), got {on_worker_failure!r}"
        )


def resolve_server_device(server_device: str, model_device: torch.device | str | None = None) -> str:
    """``server_device`` with ``"auto"`` decided (``model_device``, rank 0's model's), checked to exist here."""
    device = str(model_device) if server_device == "auto" else server_device
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"server_device={server_device!r}: this machine has no CUDA device for the parameter server. Use "
            "server_device='cpu' (or 'auto': the workers' device)."
        )
    return device


def server_count(servers: int | str, on_worker_failure: str, num_params: int, workers_on_host: int, rank: int) -> int:
    """``servers``, with ``"auto"`` decided by rank 0 (:func:`auto_servers`: the model's size, its host's
    free cores) and broadcast to every rank (a collective then: every worker calls it); one server
    with ``on_worker_failure="continue"`` (one server re-deals a lost worker's batches)."""
    if servers != "auto":
        return int(servers)
    if on_worker_failure == "continue":
        return 1
    return broadcast_object(auto_servers(num_params, workers_on_host) if rank == 0 else None, src=0)


def shard_settings(param_sizes: Sequence[int], servers: int, prefix: str, **settings: Any) -> tuple[ShardPlan, list[ServerSettings]]:
    """The split of the optimizer's tensors (of ``param_sizes`` values) over ``servers`` shards, and each
    shard's :class:`ServerSettings`: ``settings`` (every field but the shard's own) plus its number,
    its part's size, and its channel's prefix (``prefix``, ``prefix + "shard<i>/"`` with several)."""
    plan = plan_shards(list(param_sizes), servers)
    shards = [
        ServerSettings(prefix=prefix if servers == 1 else f"{prefix}shard{i}/", num_params=stop - start, shard=i,
                       shards=servers, run_prefix=prefix, **settings)
        for i, (start, stop) in enumerate(plan.values)
    ]
    return plan, shards


def serve(settings_json: str) -> None:
    """Be the server of ``settings_json`` (:meth:`ServerSettings.to_json`) in this process: a forked
    standby's work; it ends the process at ``Shutdown``."""
    run(ServerSettings.from_json(settings_json))


def start_servers(shards: Sequence[ServerSettings],
                  start_first: Callable[[str], ServerProcess] | None = None) -> list[ServerProcess]:
    """A process for each shard, shard 0 first: each a new interpreter (:func:`start_server`), or shard
    0 by ``start_first(settings_json)`` (a standby forked earlier, which calls :func:`serve`)."""
    return [start_server(s) if start_first is None or s.shard else start_first(s.to_json()) for s in shards]


def connect(shards: Sequence[ServerSettings], plan: ShardPlan, rank: int, workers: int, timeout: float,
            wire_dtype: torch.dtype) -> ParameterServerClient | ShardedClient:
    """Worker ``rank``'s client of the servers of ``shards``: the side channel to each (a collective
    with the other workers and the server), one client, or a :class:`ShardedClient` over several."""
    clients = [
        ParameterServerClient(open_channel(s.host, s.port, s.prefix, rank + 1, workers + 1, timeout), rank, wire_dtype,
                              s.name)
        for s in shards
    ]
    return clients[0] if len(clients) == 1 else ShardedClient(clients, plan)


def attach_transport(client: ParameterServerClient | ShardedClient, transport: str, size: int, announce: bool = False) -> str:
    """How ``client``'s gradients and parameters (``size`` values) travel: ``"shared_memory"`` where
    ``transport="auto"`` and the server's host lets it attach a segment, else ``"channel"``. Inside a
    shaped link (:mod:`lightning_hybrid.sim.link`) always the channel, which the link shapes (and
    ``announce`` logs it)."""
    if transport == "auto" and (link := in_shaped_link()) is not None:
        if announce:  # shared memory would bypass the link under measurement
            log.info("parameter server: a shaped link (%s=%s): gradients and parameters through the side channel, not "
                     "shared memory", LINK_ENV, link)
        return "channel"
    return client.attach_shared_memory(size) if transport == "auto" else "channel"


def stop_servers(processes: Sequence[ServerProcess], ask_to_end: Callable[[], Any], patience_s: float = 30.0,
                 forget: Callable[[ServerProcess], None] | None = None) -> Any:
    """End server processes on purpose: ``forget(process)`` each (stop watching it: its exit is no
    death to report), ``ask_to_end()``, wait ``patience_s`` for each, kill it if it does not end;
    what ``ask_to_end()`` returned (None and nothing asked without processes)."""
    if not processes:
        return None
    if forget is not None:
        for process in processes:
            forget(process)
    answer = ask_to_end()
    for process in processes:
        try:
            process.wait(timeout=patience_s)
        except subprocess.TimeoutExpired:
            process.kill()
    return answer
