"""LocalSGD on 2 gloo processes against a one-process reference of its rules (written apart from it),
and against the algorithms it generalises: H = 1 with plain averaging is the delayed all-reduce of the
same delay, and with no delay it is DDP (SGD on the mean gradient)."""

from __future__ import annotations

import os
from collections import deque
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import free_port, shared_folder
from two_rank_model import batches, make_model  # the same model and per-rank batches

from lightning_hybrid.comm.delayed_allreduce import DelayedAllReduce
from lightning_hybrid.comm.flat import copy_into, flatten
from lightning_hybrid.comm.stop_signal import WIDTH
from lightning_hybrid.comm.outer_rounds import LocalSGD, cut_fragments, validate

STEPS, LR, MOMENTUM = 13, 0.05, 0.9
#: (sync_every, delay, outer, fragments, wire, steps before which a sync point comes)
SETTINGS = {
    "ddp": (1, 0, "average", 1, "fp32", ()),
    "delayed": (1, 1, "average", 1, "fp32", (6,)),
    "nesterov": (4, 1, "nesterov", 2, "fp32", (6,)),
    "streaming_bf16": (4, 2, "nesterov", 2, "bf16", (9,)),
    "rounds_only": (3, 0, "nesterov", 1, "fp32", ()),
}


def inner_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def loss_of(model, rank, step):
    x, y = batches(rank, step)
    return torch.nn.functional.mse_loss(model(x), y)


def train(rank: int, setting: tuple, restart_at: int | None = None) -> dict:
    """One rank's run of ``setting``; ``restart_at``: before that step, checkpoint (the rank's weights and
    inner state, LocalSGD's state) and continue with everything rebuilt from the checkpoint."""
    sync_every, delay, outer, fragments, wire, syncs = setting
    model = make_model()
    inner = inner_optimizer(model)
    local = LocalSGD(model.parameters(), sync_every, delay, outer, fragments=fragments, wire_dtype=wire)
    for step in range(STEPS):
        if step == restart_at:
            saved = {"model": model.state_dict(), "inner": inner.state_dict(), "local": local.state_dict()}
            model = make_model()
            model.load_state_dict(saved["model"])
            inner = inner_optimizer(model)
            inner.load_state_dict(saved["inner"])
            local = LocalSGD(model.parameters(), sync_every, delay, outer, fragments=fragments, wire_dtype=wire)
            local.load_state_dict(saved["local"])
        if step in syncs:
            local.sync()
        inner.zero_grad()
        loss_of(model, rank, step).backward()
        inner.step()
        local.after_inner_step()
    local.sync()
    return {"params": [p.detach().clone() for p in model.parameters()], "bytes": local.bytes_sent}


def delayed_all_reduce(rank: int, delay: int) -> list[torch.Tensor]:
    """The delayed all-reduce of ``delay`` steps with the same inner optimizer, drained at the same sync points."""
    model = make_model()
    opt = inner_optimizer(model)
    exchange = DelayedAllReduce(list(model.parameters()), delay)
    for step in range(STEPS):
        if step in SETTINGS["delayed"][5]:
            exchange.apply_pending(opt)
        opt.zero_grad()
        loss_of(model, rank, step).backward()
        exchange.push()
        if exchange.load_ready_into_grads():
            opt.step()
    exchange.apply_pending(opt)
    return [p.detach().clone() for p in model.parameters()]


def worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    results = {name: train(rank, setting) for name, setting in SETTINGS.items()}
    results["nesterov_restarted"] = train(rank, SETTINGS["nesterov"], restart_at=5)
    results["streaming_bf16_restarted"] = train(rank, SETTINGS["streaming_bf16"], restart_at=7)
    results["delayed_all_reduce"] = {"params": delayed_all_reduce(rank, 1)}
    torch.save(results, f"{out}.{rank}")
    dist.destroy_process_group()


def reference(setting: tuple) -> list[torch.Tensor]:
    """The rules of lightning_hybrid.comm.outer_rounds, in one process: two models, each with its own
    inner optimizer on its own batches; per fragment, the global weights and their outer optimizer;
    a round's pseudo-gradients summed (in bf16 with a bf16 wire) and applied ``delay`` rounds later."""
    sync_every, delay, outer, fragments, wire, syncs = setting
    models = [make_model() for _ in range(2)]
    inners = [inner_optimizer(m) for m in models]
    params = [list(m.parameters()) for m in models]
    groups = cut_fragments(params[0], fragments)
    thetas, outers, pending, offsets = [], [], [], []
    for f, group in enumerate(groups):
        theta = flatten([params[0][i] for i in group]).clone()
        thetas.append(theta)
        outers.append(torch.optim.SGD([theta], lr=0.7, momentum=0.9, nesterov=True) if outer == "nesterov"
                      else torch.optim.SGD([theta], lr=1.0))
        pending.append(deque())
        offsets.append(f * sync_every // fragments)

    def apply(f, summed):
        thetas[f].grad = summed / 2
        outers[f].step()

    def end_round(f, keep):
        deltas = [thetas[f] - flatten([params[r][i] for i in groups[f]]) for r in range(2)]
        summed = (deltas[0].bfloat16() + deltas[1].bfloat16()).float() if wire == "bf16" else deltas[0] + deltas[1]
        pending[f].append(summed)
        while len(pending[f]) > keep:
            apply(f, pending[f].popleft())
        for r in range(2):
            copy_into(thetas[f], [params[r][i] for i in groups[f]])

    t = 0

    def sync():
        nonlocal t
        for f in range(len(groups)):
            first = sync_every - offsets[f]
            in_round = t if t < first else (t - first) % sync_every
            if in_round:
                end_round(f, 0)
            else:
                while pending[f]:
                    apply(f, pending[f].popleft())
                for r in range(2):
                    copy_into(thetas[f], [params[r][i] for i in groups[f]])
        t = 0

    for step in range(STEPS):
        if step in syncs:
            sync()
        for r in range(2):
            inners[r].zero_grad()
            loss_of(models[r], r, step).backward()
            inners[r].step()
        t += 1
        for f in range(len(groups)):
            if (t + offsets[f]) % sync_every == 0:
                end_round(f, delay)
    sync()
    return [p.detach() for p in params[0]]


def ddp_reference() -> list[torch.Tensor]:
    """SGD with momentum on the mean of both ranks' gradients."""
    model = make_model()
    opt = inner_optimizer(model)
    for step in range(STEPS):
        opt.zero_grad()
        (sum(loss_of(model, r, step) for r in range(2)) / 2).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    def train(folder: Path) -> None:
        folder.mkdir()
        mp.start_processes(worker, args=(free_port(), str(folder / "result")), nprocs=2, start_method="forkserver")

    out = shared_folder(tmp_path_factory, "local_sgd_rules", train)
    return [torch.load(out / f"result.{r}") for r in (0, 1)]


def assert_params(got, want, **tolerance):
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **(tolerance or {"rtol": 1e-5, "atol": 1e-6}))


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", list(SETTINGS))
def test_two_processes_follow_the_rules(runs, name):
    expected = reference(SETTINGS[name])
    for result in runs:
        assert_params(result[name]["params"], expected)
    assert_params(runs[0][name]["params"], runs[1][name]["params"], rtol=0, atol=0)


@pytest.mark.multiprocess
def test_one_step_rounds_with_plain_averaging_are_ddp_and_the_delayed_all_reduce(runs):
    assert_params(runs[0]["ddp"]["params"], ddp_reference())
    assert_params(runs[0]["delayed"]["params"], runs[0]["delayed_all_reduce"]["params"])
    assert not torch.allclose(runs[0]["delayed"]["params"][0], runs[0]["ddp"]["params"][0]), "the delay changes the run"


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", ["nesterov", "streaming_bf16"])
def test_a_run_restored_from_a_checkpoint_mid_round_continues_exactly(runs, name):
    for result in runs:
        assert_params(result[f"{name}_restarted"]["params"], result[name]["params"], rtol=0, atol=0)


@pytest.mark.multiprocess
def test_bytes_sent_are_the_rounds_pseudo_gradients(runs):
    numel = sum(p.numel() for p in make_model().parameters()) + WIDTH  # the stop flags ride along
    assert runs[0]["ddp"]["bytes"] == STEPS * numel * 4, "one fp32 average a step"
    # 3-step rounds: 4 rounds in 13 steps, then the sync ends the fifth, one step long
    assert runs[0]["rounds_only"]["bytes"] == 5 * numel * 4
    assert runs[0]["streaming_bf16"]["bytes"] < runs[0]["nesterov"]["bytes"] * 0.6, "bf16: half the bytes"


def test_fragments_and_bad_settings():
    params = [torch.zeros(10), torch.zeros(300), torch.zeros(5), torch.zeros(300)]
    assert cut_fragments(params, 2) == [[0, 1], [2, 3]]
    assert cut_fragments(params, 4) == [[0], [1], [2], [3]]
    with pytest.raises(ValueError, match="at most"):
        cut_fragments(params, 5)
    good = dict(sync_every=8, delay=1, outer="nesterov", outer_lr=0.7, outer_momentum=0.9, fragments=2, wire_dtype="fp32")
    for change, match in ((dict(sync_every=0), "sync_every"), (dict(delay=-1), "delay"), (dict(fragments=3), "divide"),
                          (dict(outer="adam"), "outer_optimizer"), (dict(outer_momentum=1.0), "outer_momentum"),
                          (dict(wire_dtype="fp8"), "wire_dtype")):
        with pytest.raises(ValueError, match=match):
            validate(**{**good, **change})


# ---------------------------------------------------------------------- LocalSGDStrategy under a Trainer
def rank_params(folder) -> list[dict]:
    return [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.mark.multiprocess
def test_the_strategy_with_one_step_rounds_and_plain_averaging_is_ddp(tmp_path, tmp_path_factory):
    from conftest import REFERENCE, run_train_script, shared_train_script

    ddp = torch.load(shared_train_script(tmp_path_factory, "--strategy", "ddp", *REFERENCE) / "rank0.pt")
    run_train_script(tmp_path, "--strategy", "local_sgd", "--sync-every", "1", "--outer", "average", "--delay", "0",
                     *REFERENCE)
    for result in rank_params(tmp_path):
        for name, want in ddp.items():
            if name.startswith("net."):
                torch.testing.assert_close(result[name], want, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.multiprocess
def test_a_run_stopped_mid_round_resumes_exactly(tmp_path):
    """Rounds of 4 steps, the average a round late, 2 fragments: SIGTERM after batch 2 of epoch 1 (mid
    epoch, mid round, an average in flight) stops both ranks; the checkpoint holds the outer optimizers,
    the pending averages and each rank's own weights and momentum, and the same command run again ends
    where the uninterrupted run does."""
    from preemption_runs import callbacks, run

    settings = ("strategy=local_sgd", "strategy.sync_every=4", "strategy.delay=1", "strategy.fragments=2",
                "strategy.fork_ranks=true", "trainer.devices=2", "optimizer.momentum=0.9")
    interrupted = (*settings, f"hydra.run.dir={tmp_path / 'run'}", *callbacks(tmp_path, "resumed", epoch=1, batch=2))
    stopped = run(*interrupted, cwd=tmp_path)
    assert stopped.returncode == 143 and "last-interrupted.ckpt" in stopped.stdout, (stopped.stdout + stopped.stderr)[-3000:]
    resumed = run(*interrupted, cwd=tmp_path)
    assert resumed.returncode == 0 and "resumed in epoch 2" in resumed.stdout + resumed.stderr, resumed.stderr[-3000:]
    reference = run(*settings, f"hydra.run.dir={tmp_path / 'reference'}", *callbacks(tmp_path, "reference"), cwd=tmp_path)
    assert reference.returncode == 0, reference.stderr[-3000:]
    got, expected = torch.load(tmp_path / "resumed.pt"), torch.load(tmp_path / "reference.pt")
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6, msg=name)
