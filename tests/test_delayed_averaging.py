"""DelayedGradientAveraging on 2 gloo processes against one-process references of its definition.

SGD ("replace"): the reference replays it. After step t a rank's weights and momentum buffers are torch's
SGD fed avg_0, ..., avg_{t-D}, then the rank's own g_{t-D+1}, ..., g_t: the reference keeps an SGD that
has taken the averages (the synchronous part) and, every step, copies it and steps the copy with the
rank's last D gradients. No response coefficient appears in it. Other optimizers ("update"): each rank's
own optimizer step, and D steps later its update replaced by the ranks' mean update.
"""

from __future__ import annotations

import copy
import os
import signal

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import free_port

from lightning_hybrid.comm.delayed_averaging import DelayedGradientAveraging, sgd_response

STEPS, RANKS = 9, 2
#: name -> (optimizer factory over the model, learning rate of each step's groups)
OPTIMIZERS = {
    "sgd": lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
    "momentum": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
    "nesterov_wd": lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1),
    "dampening_groups": lambda m: torch.optim.SGD(
        [{"params": m[0].parameters(), "lr": 0.2, "momentum": 0.5, "dampening": 0.3},
         {"params": m[2].parameters(), "weight_decay": 0.05}], lr=0.1, momentum=0.9),
    "adam": lambda m: torch.optim.Adam(m.parameters(), lr=0.01),
    "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.1),
}


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 5, generator=g), torch.randn(8, 2, generator=g)


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def backward(model: torch.nn.Module, rank: int, step: int) -> None:
    model.zero_grad()
    x, y = batch(rank, step)
    torch.nn.functional.mse_loss(model(x), y).backward()


def schedule(optimizer: torch.optim.Optimizer, step: int) -> None:
    """The rates move at step 4 (a scheduler): a correction must use the rates each step had."""
    if step == 4:
        for group in optimizer.param_groups:
            group["lr"] *= 0.5


def run_case(rank: int, name: str, delay: int, restart_at: int | None = None, stop_at: int | None = None) -> dict:
    model = make_model()
    optimizer = OPTIMIZERS[name](model)
    dga = DelayedGradientAveraging(optimizer, delay, bucket_size_mb=1e-4)
    stops = []
    for step in range(STEPS):
        if step == restart_at:  # a checkpoint between sync points: this rank's weights, optimizer, pending
            saved = copy.deepcopy({"model": model.state_dict(), "opt": optimizer.state_dict(), "dga": dga.state_dict()})
            model = make_model()
            model.load_state_dict(saved["model"])
            optimizer = OPTIMIZERS[name](model)
            optimizer.load_state_dict(saved["opt"])
            dga = DelayedGradientAveraging(optimizer, delay, bucket_size_mb=1e-4)
            dga.load_state_dict(saved["dga"])
        schedule(optimizer, step)
        backward(model, rank, step)
        dga.step(stop=int(signal.SIGTERM) if step == stop_at and rank == 1 else 0)
        stops.append(dga.stop)
    before_sync = [p.detach().clone() for p in model.parameters()]
    dga.sync()
    return {"params": [p.detach() for p in model.parameters()], "before_sync": before_sync, "stops": stops,
            "applied": dga.applied}


def worker(rank: int, port: int, cases: list[dict], out: str) -> None:
    """Every case in turn on one process group (one start of the two processes for them all)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=RANKS)
    torch.save([run_case(rank, **case) for case in cases], f"{out}.{rank}")
    dist.destroy_process_group()


def replayed_sgd(name: str, delay: int) -> dict:
    """Each rank's weights after every step, and everyone's after the final sync, by replaying SGD."""
    models = [make_model() for _ in range(RANKS)]
    synchronous = make_model()
    sync_opt = OPTIMIZERS[name](synchronous)
    grads: list[list[list[torch.Tensor]]] = []  # [step][rank] -> gradients
    base = [g["lr"] for g in sync_opt.param_groups]
    lrs = [[lr * (0.5 if step >= 4 else 1.0) for lr in base] for step in range(STEPS)]  # as schedule() moves them
    for step in range(STEPS):
        grads.append([])
        for rank, model in enumerate(models):
            backward(model, rank, step)
            grads[-1].append([p.grad.clone() for p in model.parameters()])
        done = step - delay  # the synchronous part takes the average of this step
        if done >= 0:
            take(synchronous, sync_opt, [sum(g) / RANKS for g in zip(*grads[done])], lrs[done])
        for rank, model in enumerate(models):
            replica = copy.deepcopy(synchronous)
            replica_opt = OPTIMIZERS[name](replica)
            replica_opt.load_state_dict(copy.deepcopy(sync_opt.state_dict()))  # its own buffers
            for k in range(max(done + 1, 0), step + 1):
                take(replica, replica_opt, grads[k][rank], lrs[k])
            model.load_state_dict(replica.state_dict())
    for done in range(STEPS - delay, STEPS):
        take(synchronous, sync_opt, [sum(g) / RANKS for g in zip(*grads[done])], lrs[done])
    return {"ranks": [[p.detach() for p in m.parameters()] for m in models],
            "synced": [p.detach() for p in synchronous.parameters()]}


def take(model: torch.nn.Module, optimizer: torch.optim.Optimizer, grads: list[torch.Tensor], lrs: list[float]) -> None:
    for p, g in zip(model.parameters(), grads):
        p.grad = g.clone()
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    optimizer.step()


def replayed_updates(name: str, delay: int) -> dict:
    """Each rank's own optimizer; its update of step s replaced by the ranks' mean update D steps later."""
    models = [make_model() for _ in range(RANKS)]
    optimizers = [OPTIMIZERS[name](m) for m in models]
    updates: list[list[list[torch.Tensor]]] = []
    for step in range(STEPS):
        updates.append([])
        for rank, (model, opt) in enumerate(zip(models, optimizers)):
            schedule(opt, step)
            backward(model, rank, step)
            before = [p.detach().clone() for p in model.parameters()]
            opt.step()
            updates[-1].append([b - p.detach() for b, p in zip(before, model.parameters())])
        if step - delay >= 0:
            correct(models, updates[step - delay])
    ranks = [[p.detach().clone() for p in m.parameters()] for m in models]
    for done in range(STEPS - delay, STEPS):
        correct(models, updates[done])
    return {"ranks": ranks, "synced": [p.detach() for p in models[0].parameters()]}


def correct(models: list[torch.nn.Module], updates: list[list[torch.Tensor]]) -> None:
    mean = [sum(u) / RANKS for u in zip(*updates)]
    with torch.no_grad():
        for model, own in zip(models, updates):
            for p, u, m in zip(model.parameters(), own, mean):
                p.add_(u - m)


def run(tmp_path, cases: list[dict]) -> list[list[dict]]:
    """Each case's result on each rank: ``[case][rank]``."""
    out = str(tmp_path / "result")
    mp.start_processes(worker, args=(free_port(), cases, out), nprocs=RANKS, start_method="forkserver")
    per_rank = [torch.load(f"{out}.{r}") for r in range(RANKS)]
    return [list(results) for results in zip(*per_rank)]


def reference(name: str, delay: int) -> dict:
    return replayed_sgd(name, delay) if name.startswith(("sgd", "momentum", "nesterov", "dampening")) \
        else replayed_updates(name, delay)


def close(got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> None:
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=what)


CASES = [("sgd", 1), ("momentum", 1), ("momentum", 3), ("nesterov_wd", 2), ("dampening_groups", 2), ("adam", 1),
         ("adamw", 2)]


@pytest.mark.multiprocess
def test_two_processes_equal_the_reference_and_resume_exactly_and_agree_on_stops(tmp_path):
    """Every optimizer and delay of CASES against its reference; delay 0 is DDP; a checkpoint after step 4 with
    2 exchanges in flight (this rank's weights, optimizer state and pending exchanges: the averages and its own
    values) resumes to the uninterrupted result; a stop asked on rank 1 at step 3 is agreed by both ranks, with
    delay 2, when step 3's average is applied, after step 5. One start of the two processes for them all."""
    cases = [{"name": n, "delay": d} for n, d in CASES] + [{"name": n, "delay": 0} for n in ("momentum", "adamw")] \
        + [{"name": n, "delay": 2, "restart_at": 5} for n in ("momentum", "adam")] \
        + [{"name": "momentum", "delay": 2, "stop_at": 3}]
    results = run(tmp_path, cases)
    for case, ranks in zip(cases, results):
        what = ", ".join(f"{k}={v}" for k, v in case.items())
        if case["delay"] == 0:
            for result in ranks:
                close(result["params"], ddp(case["name"]), f"DDP ({what})")
            continue
        expected = reference(case["name"], case["delay"])
        for rank, result in enumerate(ranks):
            close(result["params"], expected["synced"], f"rank {rank} after the sync ({what})")
            if "restart_at" not in case:
                assert result["applied"] == STEPS
                close(result["before_sync"], expected["ranks"][rank], f"rank {rank} before the sync ({what})")
        assert not torch.equal(ranks[0]["before_sync"][0], ranks[1]["before_sync"][0]), f"ranks differ between syncs ({what})"
        for a, b in zip(ranks[0]["params"], ranks[1]["params"]):
            assert torch.equal(a, b), f"after a sync the ranks hold one model, to the bit ({what})"
        if "stop_at" in case:
            for result in ranks:
                assert result["stops"] == [0] * 5 + [int(signal.SIGTERM)] * (STEPS - 5)
        else:
            assert all(result["stops"] == [0] * STEPS for result in ranks)


def ddp(name: str) -> list[torch.Tensor]:
    """DDP: every step the mean of both ranks' gradients, whatever the optimizer."""
    model = make_model()
    optimizer = OPTIMIZERS[name](model)
    for step in range(STEPS):
        schedule(optimizer, step)
        grads = []
        for rank in range(RANKS):
            backward(model, rank, step)
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, g in zip(model.parameters(), zip(*grads)):
            p.grad = sum(g) / RANKS
        optimizer.step()
    return [p.detach() for p in model.parameters()]


def test_sgd_response_is_sgds_own_answer():
    """The response coefficients against torch's SGD itself: a unit gradient change at the first step."""
    for kwargs in ({}, {"momentum": 0.9}, {"momentum": 0.9, "nesterov": True, "weight_decay": 0.1},
                   {"momentum": 0.5, "dampening": 0.3, "weight_decay": 0.2}, {"momentum": 0.9, "maximize": True}):
        for first in (True, False):
            lrs = [0.1, 0.05, 0.2]
            runs = []
            for nudge in (0.0, 1.0):
                w = torch.nn.Parameter(torch.tensor([0.3]))
                opt = torch.optim.SGD([w], lr=0.1, **kwargs)
                if not first:  # a buffer exists already
                    w.grad = torch.tensor([0.7])
                    opt.step()
                for k, lr in enumerate(lrs):
                    opt.param_groups[0]["lr"] = lr
                    w.grad = torch.tensor([0.25 * k + (nudge if k == 0 else 0.0)])
                    opt.step()
                runs.append((w.detach().clone(), opt.state[w]["momentum_buffer"].clone() if "momentum" in kwargs else None))
            a, b = sgd_response(lrs, first, **kwargs)
            assert (runs[1][0] - runs[0][0]).item() == pytest.approx(a, rel=1e-5, abs=1e-6), kwargs
            if "momentum" in kwargs:
                assert (runs[1][1] - runs[0][1]).item() == pytest.approx(b, rel=1e-5, abs=1e-6), kwargs
