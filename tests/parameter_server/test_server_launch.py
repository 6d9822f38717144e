"""A run's parameter servers from the workers' side (lightning_hybrid.parameter_server.server_launch), and the
survivors' group after a lost worker (lightning_hybrid.comm.regroup.regroup_survivors), without a Trainer or a
process group: the processes, channels and collectives are stand-ins."""

from __future__ import annotations

import subprocess

import pytest
import torch

from lightning_hybrid.comm import regroup as regroup_module
from lightning_hybrid.comm.regroup import regroup_survivors
from lightning_hybrid.parameter_server import server_launch
from lightning_hybrid.parameter_server.protocol import ServerSettings
from lightning_hybrid.parameter_server.sharding import ShardedClient, auto_servers, plan_shards

NO_CUDA = not torch.cuda.is_available()


@pytest.mark.parametrize("options, message", [
    (dict(servers=0), "servers must be a positive number of server processes or 'auto', got 0"),
    (dict(servers=True), "servers must be a positive number"),
    (dict(servers="two"), "servers must be a positive number"),
    (dict(servers=2, on_worker_failure="continue"), "works with one parameter server only"),
    (dict(transport="shm"), "transport must be 'auto'"),
    (dict(timeout=0), "timeout must be a positive number of seconds, got 0"),
    (dict(on_worker_failure="retry"), "on_worker_failure must be 'stop'"),
    (dict(server_device="tpu"), "server_device must be 'cpu', 'cuda' or 'cuda:N'"),
])
def test_check_options_refuses_what_cannot_run(options, message):
    given = dict(timeout=30.0, on_worker_failure="stop", transport="auto", servers="auto", server_device="cpu") | options
    with pytest.raises(ValueError, match=message):
        server_launch.check_options(**given)


def test_check_options_accepts_the_defaults_and_continue_with_one_server():
    server_launch.check_options(300.0, "stop", "auto", "auto", "cpu")
    server_launch.check_options(300.0, "continue", "channel", 1, "auto")  # "auto" device: decided at setup


@pytest.mark.skipif(not NO_CUDA, reason="this machine has a CUDA device")
def test_a_cuda_server_device_without_cuda_is_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="no CUDA device for the parameter server"):
        server_launch.check_options(30.0, "stop", "auto", "auto", "cuda")
    with pytest.raises(ValueError, match="server_device='auto'"):
        server_launch.resolve_server_device("auto", "cuda:0")


def test_resolve_server_device_takes_the_model_device_for_auto_only():
    assert server_launch.resolve_server_device("auto", torch.device("cpu")) == "cpu"
    assert server_launch.resolve_server_device("cpu", torch.device("meta")) == "cpu"


def test_server_count_broadcasts_rank_zeros_auto_choice_only(monkeypatch):
    calls = []

    def broadcast(obj, src):
        calls.append((obj, src))
        return 7

    monkeypatch.setattr(server_launch, "broadcast_object", broadcast)
    assert server_launch.server_count(3, "stop", 10, 2, rank=1) == 3
    assert server_launch.server_count("auto", "continue", 10**9, 2, rank=0) == 1  # one server re-deals a lost worker's batches
    assert calls == []
    assert server_launch.server_count("auto", "stop", 40_000_000, 2, rank=0) == 7
    assert server_launch.server_count("auto", "stop", 40_000_000, 2, rank=1) == 7
    assert calls == [(auto_servers(40_000_000, 2), 0), (None, 0)]


def test_shard_settings_splits_the_parameters_and_names_each_shards_channel():
    common = dict(host="127.0.0.1", port=1234, workers=2, staleness=1.0, sync="bounded", timeout=9.0)
    plan, [only] = server_launch.shard_settings([10, 20, 30, 40], 1, "run/", **common)
    assert (only.prefix, only.num_params, only.shard, only.shards) == ("run/", 100, 0, 1)
    assert (only.host, only.port, only.workers, only.sync, only.timeout) == ("127.0.0.1", 1234, 2, "bounded", 9.0)
    plan, shards = server_launch.shard_settings([10, 20, 30, 40], 2, "run/", **common)
    assert plan == plan_shards([10, 20, 30, 40], 2)
    assert [s.prefix for s in shards] == ["run/shard0/", "run/shard1/"]
    assert [s.num_params for s in shards] == [stop - start for start, stop in plan.values]
    assert sum(s.num_params for s in shards) == 100
    assert [(s.shard, s.shards) for s in shards] == [(0, 2), (1, 2)]


class FakeProcess:
    def __init__(self, ends: bool) -> None:
        self.ends, self.killed, self.waited = ends, False, None

    def poll(self):
        return 0 if self.ends or self.killed else None

    def wait(self, timeout=None):
        self.waited = timeout
        if not self.ends:
            raise subprocess.TimeoutExpired("server", timeout)
        return 0

    def kill(self):
        self.killed = True


def test_stop_servers_forgets_asks_waits_and_kills_the_ones_that_stay():
    events = []
    done, stuck = FakeProcess(ends=True), FakeProcess(ends=False)
    answer = server_launch.stop_servers([done, stuck], lambda: events.append("asked") or "bye", patience_s=0.5,
                                        forget=lambda process: events.append(process))
    assert answer == "bye"
    assert events == [done, stuck, "asked"]  # no longer watched before it is asked to end
    assert (done.waited, stuck.waited) == (0.5, 0.5)
    assert not done.killed and stuck.killed


def test_stop_servers_without_processes_asks_nothing():
    assert server_launch.stop_servers([], lambda: pytest.fail("asked a server that is not there")) is None


def settings(shards: int) -> list[ServerSettings]:
    return server_launch.shard_settings([5] * shards, shards, "p/", host="h", port=1, workers=2, staleness=0.0)[1]


def test_start_servers_gives_shard_zero_to_a_standby_and_starts_the_others(monkeypatch):
    started = []
    monkeypatch.setattr(server_launch, "start_server", lambda s: started.append(s.shard) or f"process{s.shard}")
    sent = []
    processes = server_launch.start_servers(settings(3), lambda message: sent.append(message) or "standby")
    assert processes == ["standby", "process1", "process2"]
    assert started == [1, 2]
    assert ServerSettings.from_json(sent[0]) == settings(3)[0]
    started.clear()
    assert server_launch.start_servers(settings(2)) == ["process0", "process1"]


def test_serve_runs_the_server_of_the_settings_it_is_sent(monkeypatch):
    ran = []
    monkeypatch.setattr(server_launch, "run", ran.append)
    server_launch.serve(settings(1)[0].to_json())
    assert ran == [settings(1)[0]]


class FakeClient:
    def __init__(self, pg, worker, wire_dtype, name="parameter server"):
        self.pg, self.worker, self.wire_dtype, self.name = pg, worker, wire_dtype, name

    def attach_shared_memory(self, size):
        self.attached = size
        return "shared_memory"


def test_connect_opens_a_channel_to_each_shard_and_shards_the_client(monkeypatch):
    opened = []
    monkeypatch.setattr(server_launch, "open_channel", lambda *args: opened.append(args) or f"pg{len(opened)}")
    monkeypatch.setattr(server_launch, "ParameterServerClient", FakeClient)
    one = settings(1)
    client = server_launch.connect(one, plan_shards([5], 1), rank=1, workers=2, timeout=3.0, wire_dtype=torch.bfloat16)
    assert isinstance(client, FakeClient) and (client.pg, client.worker, client.wire_dtype) == ("pg1", 1, torch.bfloat16)
    assert opened == [("h", 1, "p/", 2, 3, 3.0)]  # rank 1 of the workers is rank 2 of the channel (the server's is 0)
    two = settings(2)
    sharded = server_launch.connect(two, plan_shards([5, 5], 2), rank=0, workers=2, timeout=3.0, wire_dtype=torch.float32)
    assert isinstance(sharded, ShardedClient)
    assert [c.name for c in sharded.clients] == ["parameter server shard 0", "parameter server shard 1"]
    assert [args[2] for args in opened[1:]] == ["p/shard0/", "p/shard1/"]


def test_attach_transport_uses_shared_memory_only_when_auto_and_outside_a_shaped_link(monkeypatch):
    monkeypatch.setattr(server_launch, "in_shaped_link", lambda: None)
    client = FakeClient(None, 0, torch.float32)
    assert server_launch.attach_transport(client, "channel", 10) == "channel"
    assert not hasattr(client, "attached")
    assert server_launch.attach_transport(client, "auto", 10) == "shared_memory" and client.attached == 10
    monkeypatch.setattr(server_launch, "in_shaped_link", lambda: "100mbit")
    shaped = FakeClient(None, 0, torch.float32)
    assert server_launch.attach_transport(shaped, "auto", 10, announce=True) == "channel"
    assert not hasattr(shaped, "attached")  # shared memory would bypass the link under measurement


def test_regroup_survivors_regroups_only_when_a_worker_is_gone(monkeypatch):
    calls = []
    monkeypatch.setattr(regroup_module, "regroup", lambda *args: calls.append(args) or 0)
    assert regroup_survivors([0, 1, 2], 0, 0, "h", 1, "ps/", 5.0) == [0, 1, 2]  # the reply says nothing
    assert regroup_survivors([0, 1, 2], 0b111, 0, "h", 1, "ps/", 5.0) == [0, 1, 2]
    assert calls == []
    assert regroup_survivors([0, 1, 2], 0b101, 2, "h", 1, "ps/", 5.0) == [0, 2]
    assert calls == [([0, 2], 2, "h", 1, "ps/survivors/0-2/", 5.0)]
