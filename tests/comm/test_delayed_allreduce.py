"""DelayedAllReduce on 2 gloo processes against a single-process reference of its semantics."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import free_port
from two_rank_model import batches, make_model

from lightning_hybrid.comm.delayed_allreduce import DelayedAllReduce, make_buckets, validate

STEPS, LR, DC_LAMBDA = 7, 0.1, 0.5


def loss_of(model, rank, step):
    x, y = batches(rank, step)
    return torch.nn.functional.mse_loss(model(x), y)


def worker(rank: int, port: int, delay: int, compensation, out: str, restart_at: int | None = None) -> None:
    """``restart_at``: after that step, checkpoint (model, optimizer, pending averages) and continue
    with a new model, optimizer and exchange restored from the checkpoint."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    exchange = DelayedAllReduce(list(model.parameters()), delay, bucket_size_mb=1e-4, compensation=compensation, dc_lambda=DC_LAMBDA)
    applied = []
    for step in range(STEPS):
        if step == restart_at:
            saved = {"model": model.state_dict(), "opt": opt.state_dict(), "pending": exchange.pending_state()}
            model = make_model()
            model.load_state_dict(saved["model"])
            opt = torch.optim.SGD(model.parameters(), lr=LR)
            opt.load_state_dict(saved["opt"])
            exchange = DelayedAllReduce(list(model.parameters()), delay, bucket_size_mb=1e-4, compensation=compensation,
                                        dc_lambda=DC_LAMBDA)
            exchange.load_pending_state(saved["pending"])
        opt.zero_grad()
        loss_of(model, rank, step).backward()
        exchange.push()
        if exchange.load_ready_into_grads():
            opt.step()
            applied.append(step)
    drained = 0
    for _ in exchange.drain_into_grads():
        opt.step()
        drained += 1
    torch.save({"params": [p.detach() for p in model.parameters()], "applied": applied, "drained": drained}, f"{out}.{rank}")
    dist.destroy_process_group()


def reference(delay: int, compensation) -> list[torch.Tensor]:
    """One process: step t's gradient is the mean over both ranks' batches at the weights of step t,
    applied (compensated) delay steps later; what is pending at the end is applied in order."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    params = list(model.parameters())
    pending: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []

    def apply(grads, weights_then):
        for p, g, w in zip(params, grads, weights_then):
            p.grad = g + DC_LAMBDA * g * g * (p.detach() - w) if compensation == "dc" else g.clone()
        opt.step()

    for step in range(STEPS):
        grads = []
        for rank in (0, 1):
            model.zero_grad()
            loss_of(model, rank, step).backward()
            grads.append([p.grad.clone() for p in params])
        mean = [(a + b) / 2 for a, b in zip(*grads)]
        pending.append((mean, [p.detach().clone() for p in params]))
        if len(pending) > delay:
            apply(*pending.pop(0))
    for item in pending:
        apply(*item)
    return [p.detach() for p in params]


@pytest.mark.multiprocess
@pytest.mark.parametrize("delay, compensation", [(0, None), (1, None), (2, None), (2, "dc")])
def test_two_processes_equal_the_reference(tmp_path, delay, compensation):
    out = str(tmp_path / "result")
    mp.start_processes(worker, args=(free_port(), delay, compensation, out), nprocs=2, start_method="forkserver")
    results = [torch.load(f"{out}.{r}") for r in (0, 1)]
    expected = reference(delay, compensation)
    for result in results:
        assert result["applied"] == list(range(delay, STEPS)), "nothing applied while the pipeline fills"
        assert result["drained"] == delay, "every pending average applied at the end, none lost"
        for got, want in zip(result["params"], expected):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    if delay and compensation is None:
        assert not torch.allclose(results[0]["params"][0], reference(0, None)[0]), "the delay must change the result"


@pytest.mark.multiprocess
@pytest.mark.parametrize("compensation", [None, "dc"])
def test_pending_averages_survive_a_checkpoint(tmp_path, compensation):
    """A checkpoint taken between sync points holds the pending averages (pending_state); an exchange
    restored from it (load_pending_state) continues exactly as the uninterrupted one."""
    out = str(tmp_path / "result")
    mp.start_processes(worker, args=(free_port(), 2, compensation, out, 4), nprocs=2, start_method="forkserver")
    expected = reference(2, compensation)
    for result in [torch.load(f"{out}.{r}") for r in (0, 1)]:
        assert result["applied"] == list(range(2, STEPS)) and result["drained"] == 2
        for got, want in zip(result["params"], expected):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_buckets_and_bad_settings():
    params = [torch.zeros(10), torch.zeros(300), torch.zeros(5)]
    assert make_buckets(params, bucket_size_mb=1000 / 2**20) == [[0], [1], [2]]
    assert make_buckets(params, bucket_size_mb=1) == [[0, 1, 2]]
    for kwargs, match in (
        (dict(delay=-1), "non-negative integer"), (dict(delay=1.5), "non-negative integer"),
        (dict(compensation="magic"), "unknown compensation"), (dict(dc_lambda=-1.0), "dc_lambda"),
        (dict(bucket_size_mb=0), "bucket_size_mb"),
    ):
        settings = {"delay": 1, "compensation": None, "dc_lambda": 0.04, "bucket_size_mb": 25.0, **kwargs}
        with pytest.raises(ValueError, match=match):
            validate(**settings)
