"""Sharded parameter servers: the plan, the optimizer's shards, and real shard processes."""

from __future__ import annotations

import pytest
import torch

from lightning_hybrid.parameter_server.load import ServerLoad
from lightning_hybrid.parameter_server.sharding import (
    AUTO_MIN_PARAMS_PER_SHARD, auto_servers, merge_states, plan_shards, shard_optimizer,
)
from parameter_servers import make_optimizer, reference_apply, sharded_servers, two_async_pushes


def test_the_plan_balances_bytes_over_contiguous_runs_of_whole_tensors():
    plan = plan_shards([10, 10, 10, 10], 2)
    assert plan.tensors == [(0, 2), (2, 4)] and plan.values == [(0, 20), (20, 40)]
    plan = plan_shards([1, 1, 30, 1, 1], 2)  # the big tensor goes where the split is nearer half
    assert plan.values in ([(0, 2), (2, 34)], [(0, 32), (32, 34)])
    plan = plan_shards([100, 1, 1], 3)  # every shard gets at least one tensor
    assert plan.tensors == [(0, 1), (1, 2), (2, 3)]
    assert plan_shards([5], 1).values == [(0, 5)]
    with pytest.raises(ValueError, match="3 server shards need at least 3 parameter tensors; the optimizer holds 2"):
        plan_shards([4, 4], 3)
    with pytest.raises(ValueError, match="servers must be a positive integer or 'auto', got 0"):
        plan_shards([4, 4], 0)


def test_auto_servers_follows_the_model_size_and_the_free_cores():
    assert auto_servers(61_706, workers_on_host=2, cores=16) == 1
    assert auto_servers(33_600_000, workers_on_host=2, cores=16) == 33_600_000 // AUTO_MIN_PARAMS_PER_SHARD
    assert auto_servers(33_600_000, workers_on_host=8, cores=16) == 8
    assert auto_servers(33_600_000, workers_on_host=2, cores=2) == 2  # no core left: two still use both
    assert auto_servers(6_000_000, workers_on_host=2, cores=2) == 1


def test_the_optimizers_shards_step_as_the_whole_and_merge_back_into_its_state():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n)) for n in (3, 5, 2, 4)]
    groups = [{"params": params[:3], "lr": 0.1}, {"params": params[3:], "lr": 0.01, "weight_decay": 0.1}]
    whole = torch.optim.Adam(groups)
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    sharded = torch.optim.Adam([{"params": copies[:3], "lr": 0.1}, {"params": copies[3:], "lr": 0.01, "weight_decay": 0.1}])
    plan = plan_shards([p.numel() for p in params], 2)
    shards = [shard_optimizer(sharded, copies[a:b]) for a, b in plan.tensors]
    assert [len(g["params"]) for g in shards[1].param_groups] == [1, 1], "every group kept, with the shard's own"
    for _ in range(3):
        grads = [torch.randn(p.shape) for p in params]
        for p, c, g in zip(params, copies, grads):
            p.grad, c.grad = g, g.clone()
        whole.step()
        for shard in shards:
            shard.step()
    for p, c in zip(params, copies):
        torch.testing.assert_close(c, p, rtol=0, atol=0)
    merged = merge_states([shard.state_dict() for shard in shards], plan)
    expected = whole.state_dict()
    assert merged["param_groups"] == expected["param_groups"]
    assert sorted(merged["state"]) == sorted(expected["state"])
    for index, state in expected["state"].items():
        for key, value in state.items():
            torch.testing.assert_close(merged["state"][index][key], value)


def test_combined_load_counts_every_shards_cpu_once_per_push():
    load = ServerLoad.combined([ServerLoad(10, 5, 2.0, 1.0, 0.3), ServerLoad(10, 5, 2.5, 0.8, 0.2)])
    assert (load.pushes, load.steps, load.wall_s, load.busy_s, load.cpu_s) == (10, 5, 2.5, 1.0, 0.5)
    assert load.cpu_ms_per_push == pytest.approx(50.0)


@pytest.mark.multiprocess
@pytest.mark.parametrize("shared_memory", [True, False])
def test_two_shards_apply_each_push_as_one_server_does(shared_memory):
    """Fully asynchronous, pushes one after another: each shard applies its slice of every gradient
    in the same order, so the parameters are one server's (parameter_servers.reference_apply)."""
    with sharded_servers(2, float("inf"), shared_memory) as (c0, c1):
        g, out0 = two_async_pushes(c0, c1)
        c0.push(g[2], [0.1], out0, read_version=1)  # computed at version 1 on every shard: staleness 2
        torch.testing.assert_close(out0, reference_apply(g))
        state = c0.optimizer_state()
        assert sorted(state["state"]) == [0, 1] and state["param_groups"][0]["params"] == [0, 1]
        _, whole = make_optimizer()
        whole.load_state_dict(state)  # the merged state fits the whole optimizer
        assert whole.state[whole.param_groups[0]["params"][1]]["momentum_buffer"].shape == (1, 1)
