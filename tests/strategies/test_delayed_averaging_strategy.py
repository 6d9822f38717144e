"""DelayedAveragingStrategy through a user's Trainer script on 2 gloo processes."""

from __future__ import annotations

import copy
import json
from collections import deque
from functools import partial

import pytest
import pytorch_lightning as pl
import torch
from torch.nn import functional as F

from conftest import REFERENCE, run_train_script, shared_train_script
from lightning_hybrid import DelayedAveragingStrategy, ClassifierModule
from lightning_hybrid.data import SyntheticMNISTDataModule
from lightning_hybrid.data.base import EpochSeededRandomSampler
from lightning_hybrid.data.synthetic_mnist import synthetic_classification
from lightning_hybrid.models import MLP

pytestmark = pytest.mark.multiprocess
EPOCHS, SAMPLES, GLOBAL_BATCH, LR = 3, 256, 32, 0.1


def load(path):
    return torch.load(path, weights_only=False)


def reference(
    delay: int, compensation: str | None = None, dc_lambda: float = 0.04, warmup: int = 0, momentum: float = 0.0,
    halve_lr_each_epoch: bool = False,
) -> dict:
    """One process, plain SGD, DDP's global batches: step t's mean gradient over the global batch,
    taken at the weights of step t, is applied (compensated) `delay` steps later at step t's
    learning rate; what is pending at the end of each epoch is applied in order (the strategy's sync
    point). With ``halve_lr_each_epoch``, epoch e's steps have the rate LR / 2**e (the script's StepLR)."""
    pl.seed_everything(0)  # as tests/support/train_script.py: the same initial weights
    net = MLP(activation="relu")
    params = list(net.parameters())
    optimizer = torch.optim.SGD(params, lr=LR, momentum=momentum)
    x, y = synthetic_classification(SAMPLES, (1, 28, 28), 10, seed=1)
    sampler = EpochSeededRandomSampler(range(SAMPLES), seed=0)
    pending: deque = deque()
    step = 0

    def apply(grads, weights_then, lr):
        for p, g, w in zip(params, grads, weights_then):
            p.grad = g + dc_lambda * g * g * (p.detach() - w) if compensation == "dc" else g.clone()
        optimizer.param_groups[0]["lr"] = lr
        optimizer.step()

    for epoch in range(EPOCHS):
        lr = LR / 2**epoch if halve_lr_each_epoch else LR
        sampler.set_epoch(epoch)
        order = list(sampler)
        for start in range(0, SAMPLES, GLOBAL_BATCH):
            idx = order[start : start + GLOBAL_BATCH]
            net.zero_grad()
            F.cross_entropy(net(x[idx]), y[idx]).backward()
            pending.append(([p.grad.clone() for p in params], [p.detach().clone() for p in params], lr))
            if step < warmup or len(pending) > delay:
                apply(*pending.popleft())
            step += 1
        while pending:
            apply(*pending.popleft())
    return {f"net.{name}": p.detach() for name, p in net.named_parameters()}


def check_against(result_dir, expected, atol: float = 1e-6):
    ranks = [load(result_dir / f"rank{r}.pt") for r in (0, 1)]
    for name, want in expected.items():
        torch.testing.assert_close(ranks[0][name], ranks[1][name], rtol=0, atol=0, msg=f"ranks disagree on {name}")
        torch.testing.assert_close(ranks[0][name], want, rtol=1e-5, atol=atol, msg=name)


def test_delay_zero_equals_ddp(tmp_path, tmp_path_factory):
    ddp_run = shared_train_script(tmp_path_factory, "--strategy", "ddp", *REFERENCE)
    run_train_script(tmp_path / "asgd", "--strategy", "asgd", "--delay", "0", *REFERENCE)
    ddp = load(ddp_run / "rank0.pt")
    check_against(tmp_path / "asgd", {k: v for k, v in ddp.items() if k.startswith("net.")})


@pytest.mark.parametrize(
    "delay, compensation, warmup, momentum, scheduler, correction",
    # the plain delayed step; every knob at once (delay 2, DC compensation, 3 warm-up steps,
    # momentum); an epoch-interval scheduler, whose change at an epoch's end must not reach the
    # averages flushed at that epoch's sync point (they were computed at the old rate); and the
    # momentum lowered for the delay (0.9 -> 0.4 by "subtract" at delay 1), the user's restored after
    [(1, None, 0, 0.0, False, None), (2, "dc", 3, 0.9, False, None), (2, None, 0, 0.0, True, None),
     (1, None, 0, 0.9, False, "subtract")],
)
def test_delayed_application_equals_the_reference(tmp_path, delay, compensation, warmup, momentum, scheduler, correction):
    args = ["--strategy", "asgd", "--method", "pipe_sgd", "--delay", str(delay), "--warmup", str(warmup), "--dc-lambda", "0.5",
            "--batch-size", "16", "--epochs", str(EPOCHS), "--momentum", str(momentum)]
    if compensation:
        args += ["--compensation", compensation]
    if scheduler:
        args += ["--scheduler"]
    if correction:
        args += ["--momentum-correction", correction]
    proc = run_train_script(tmp_path, *args)
    applied = momentum - delay / (1 + delay) if correction == "subtract" else momentum
    expected = reference(delay, compensation, dc_lambda=0.5, warmup=warmup, momentum=applied, halve_lr_each_epoch=scheduler)
    check_against(tmp_path, expected)
    summary = json.loads((tmp_path / "summary.json").read_text())
    # 8 optimizer steps per epoch; every average is applied exactly once, the last ones at the drain
    assert summary["pushed"] == summary["applied"] == 8 * EPOCHS
    assert summary["global_step"] == 8 * EPOCHS
    assert summary["momentum"] == momentum  # the optimizer as the user configured it, after fitting
    if correction:
        assert f"SGD's momentum {momentum:g} -> {applied:.4g} (momentum_correction={correction}" in proc.stderr


def test_momentum_correction_is_checked():
    with pytest.raises(ValueError, match="momentum_correction must be 'auto', None or one of"):
        DelayedAveragingStrategy(method="pipe_sgd", momentum_correction="halve")
    with pytest.raises(ValueError, match="under method='dga' every rank steps with its own gradient"):
        DelayedAveragingStrategy(momentum_correction="subtract")
    with pytest.raises(ValueError, match="only method='pipe_sgd' does"):
        DelayedAveragingStrategy(compensation="dc")
    assert DelayedAveragingStrategy(method="pipe_sgd")._momentum_rule == "subtract"


def test_communication_overlaps_computation(tmp_path):
    """Compute C = 0.1 s and a simulated round trip of 0.1 s (an all-reduce of 2 ranks completes L = 2 of them
    after its data, its caller not blocked): Lightning's DDP (its buckets through the latency's hook) and
    synchronous (delay 0) steps take about C + L, delayed ones less."""
    times = {}
    for name, strategy in (("ddp", ["--strategy", "ddp"]), (0, ["--strategy", "asgd", "--delay", "0"]),
                           (1, ["--strategy", "asgd", "--delay", "1"])):
        out = tmp_path / str(name)
        run_train_script(out, *strategy, "--latency", "0.1", "--compute-sleep", "0.1", "--samples", "256",
                         "--batch-size", "16", "--epochs", "2", fork_ranks=name != "ddp")
        times[name] = json.loads((out / "summary.json").read_text())["epoch_times"][-1] / 8  # 8 steps per epoch
    assert times["ddp"] > 0.18 and times[0] > 0.18, times  # C + L
    assert 1.4 < times[0] / times[1] < 2.5, times  # ideal (C + L) / max(C, L) = 2


def test_lightning_features(tmp_path):
    out = tmp_path / "features"
    ckpts = tmp_path / "ckpts"
    run_train_script(out, "--strategy", "asgd", "--delay", "1", "--clip", "0.5", "--accumulate", "2", "--scheduler",
                     "--momentum", "0.9", "--epochs", "2", "--checkpoint-dir", str(ckpts))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pushed"] == summary["applied"] == 2 * 4  # 8 batches per rank and epoch, 2 per optimizer step
    assert summary["lr"] == pytest.approx(0.1 * 0.5**2)
    assert summary["predictions"] == 64 and summary["val_acc"] > 0.5
    state = torch.load(ckpts / "epoch=1.ckpt", weights_only=True)["optimizer_states"][0]["state"]
    assert state and all(s["momentum_buffer"].abs().sum() > 0 for s in state.values())
    run_train_script(tmp_path / "resumed", "--strategy", "asgd", "--delay", "1", "--epochs", "3",
                     "--resume", str(ckpts / "epoch=1.ckpt"))
    assert set(load(tmp_path / "resumed" / "indices_rank0.pt")) == {2}


@pytest.mark.parametrize("strategy", [["--strategy", "asgd", "--delay", "1"], ["--strategy", "ssp", "--staleness", "2"],
                                      ["--strategy", "cneural", "--lr", "1.0", "--devices", "1"]],
                         ids=["delayed_averaging", "ssp", "cneural"])
def test_bf16_mixed_precision(tmp_path, strategy):
    run_train_script(tmp_path, *strategy, "--precision", "bf16-mixed", "--epochs", "2")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["val_acc"] > 0.9


def test_delay_as_long_as_an_epoch_applies_everything_at_its_sync_point(tmp_path):
    proc = run_train_script(tmp_path, "--strategy", "asgd", "--delay", "8", "--epochs", "1")
    assert "is not shorter than an epoch (8 optimizer steps" in proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["pushed"] == summary["applied"] == 8


@pytest.mark.parametrize("strategy", [["--strategy", "asgd", "--delay", "1"], ["--strategy", "ssp", "--staleness", "3"]],
                         ids=["delayed_averaging", "ssp"])
def test_fast_dev_run(tmp_path, strategy):
    """One training batch per worker, one optimizer step, then one batch of validation, test and predict."""
    proc = run_train_script(tmp_path, *strategy, "--fast-dev-run")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["global_step"] == 1 and summary["predictions"] == 32
    seen = [load(tmp_path / f"indices_rank{r}.pt") for r in (0, 1)]
    assert [len(s.get(0, [])) for s in seen] == [16, 16], seen
    if strategy[1] == "asgd":
        assert summary["pushed"] == summary["applied"] == 1 and "set by fast_dev_run" in proc.stderr


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(delay=-1), "non-negative integer"),
        (dict(delay=1.5), "non-negative integer"),
        (dict(compensation="magic", method="pipe_sgd"), "unknown compensation"),
        (dict(method="async"), "method must be one of"),
        (dict(warmup_steps=-2), "warmup_steps"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DelayedAveragingStrategy(**kwargs)


def test_unsupported_runs_fail_before_workers_start():
    class Manual(ClassifierModule):
        def __init__(self):
            super().__init__(MLP(), optimizer=partial(torch.optim.SGD, lr=0.1))
            self.automatic_optimization = False

    data = SyntheticMNISTDataModule(num_train=64, num_val=8, num_test=8)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=DelayedAveragingStrategy(), max_epochs=1, logger=False)
    with pytest.raises(ValueError, match="automatic optimization"):
        trainer.fit(Manual(), datamodule=data)


def test_a_step_checkpoint_holds_the_pending_average(tmp_path):
    """ModelCheckpoint(every_n_train_steps=1) with delay 1: the checkpoint of step k holds the average step k
    started and the model it is still to be applied to (parameters and momentum, for an exact resume), and at
    its top level that model with the average applied (what the next sync point would give every rank): one
    SGD-with-momentum step from the one to the other with it. Step k+1 applies exactly that average: its
    checkpoint's top level is one step from step k's with step k+1's average."""
    run_train_script(tmp_path, "--strategy", "asgd", "--method", "pipe_sgd", "--delay", "1", "--lr", "0.05",
                     "--momentum", "0.9", "--epochs", "1", "--noise", "6", "--checkpoint-dir", str(tmp_path / "ck"),
                     "--checkpoint-every-steps", "1")
    checkpoints = {k: load(tmp_path / "ck" / f"step={k}.ckpt") for k in range(1, 9)}

    def stepped(state_dict, optimizer_state, pending):
        net = MLP(activation="relu")
        net.load_state_dict({name.removeprefix("net."): v for name, v in state_dict.items()})
        optimizer = torch.optim.SGD(net.parameters(), lr=pending["lrs"][0], momentum=0.9)
        optimizer.load_state_dict(optimizer_state)
        offset = 0
        for p in net.parameters():
            p.grad = pending["average"][offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        optimizer.step()
        return net.state_dict()

    for k in range(1, 8):
        saved = checkpoints[k]["lightning_hybrid_pending_averages"]
        (pending,) = saved["pending"]  # delay 1: one average in flight
        for name, value in stepped(saved["weights"], saved["optimizer"], pending).items():
            torch.testing.assert_close(value, checkpoints[k]["state_dict"][f"net.{name}"], rtol=1e-6, atol=1e-7,
                                       msg=f"step {k}, its top level: {name}")
        (following,) = checkpoints[k + 1]["lightning_hybrid_pending_averages"]["pending"]
        top = stepped(checkpoints[k]["state_dict"], checkpoints[k]["optimizer_states"][0], following)
        for name, value in top.items():
            torch.testing.assert_close(value, checkpoints[k + 1]["state_dict"][f"net.{name}"], rtol=1e-6, atol=1e-7,
                                       msg=f"step {k + 1}: {name}")


def test_latency_is_refused_only_where_it_delays_nothing():
    from lightning_hybrid import SSPStrategy
    from lightning_hybrid.callbacks import HeterogeneitySimulator

    sim = HeterogeneitySimulator(collective_latency_s=0.1)
    sim.check_strategy(DelayedAveragingStrategy())
    sim.check_strategy(pl.strategies.DDPStrategy())
    with pytest.raises(ValueError, match="point to point"):
        sim.check_strategy(SSPStrategy())


# ---------------------------------------------------------------------- method="dga" (the default)
def dga_reference(delay: int, momentum: float = 0.0, halve_lr_each_epoch: bool = False, adam: bool = False) -> dict:
    """Delayed gradient averaging by its definition, one process, two replicas on the ranks' own batches
    (DistributedSampler's: rank r takes every other index of the epoch's permutation). SGD: after step t a
    replica is SGD fed the ranks' mean gradients up to t - delay (the synchronous part) and then its own
    since, replayed from a copy of the synchronous part; Adam the same (its moments and weights). At each
    epoch's end everything pending is applied (the sync point)."""
    pl.seed_everything(0)
    net = MLP(activation="relu")
    make = (lambda ps: torch.optim.Adam(ps, lr=LR)) if adam else (lambda ps: torch.optim.SGD(ps, lr=LR, momentum=momentum))
    replicas = [copy.deepcopy(net) for _ in range(2)]
    optimizers = [make(r.parameters()) for r in replicas]
    synchronous = copy.deepcopy(net)
    sync_opt = make(synchronous.parameters())
    x, y = synthetic_classification(SAMPLES, (1, 28, 28), 10, seed=1)
    sampler = EpochSeededRandomSampler(range(SAMPLES), seed=0)

    def take(model, optimizer, grads, lr):
        for p, g in zip(model.parameters(), grads):
            p.grad = g.clone()
        optimizer.param_groups[0]["lr"] = lr
        optimizer.step()

    def mean(values):
        return [(a + b) / 2 for a, b in zip(*values)]

    for epoch in range(EPOCHS):
        lr = LR / 2**epoch if halve_lr_each_epoch else LR
        sampler.set_epoch(epoch)
        order = list(sampler)
        history: list[list[list[torch.Tensor]]] = []  # this epoch's steps: each replica's gradient
        for start in range(0, SAMPLES, GLOBAL_BATCH):
            values = []
            for rank, (replica, optimizer) in enumerate(zip(replicas, optimizers)):
                idx = order[start + rank : start + GLOBAL_BATCH : 2]
                replica.zero_grad()
                F.cross_entropy(replica(x[idx]), y[idx]).backward()
                values.append([p.grad.clone() for p in replica.parameters()])
            history.append(values)
            step = len(history) - 1
            if step - delay >= 0:
                take(synchronous, sync_opt, mean(history[step - delay]), lr)
            for rank, (replica, optimizer) in enumerate(zip(replicas, optimizers)):
                replica.load_state_dict(synchronous.state_dict())
                optimizer.load_state_dict(copy.deepcopy(sync_opt.state_dict()))
                for k in range(max(step - delay + 1, 0), step + 1):
                    take(replica, optimizer, history[k][rank], lr)
        for k in range(max(len(history) - delay, 0), len(history)):  # the epoch's sync point
            take(synchronous, sync_opt, mean(history[k]), lr)
        for replica, optimizer in zip(replicas, optimizers):
            replica.load_state_dict(synchronous.state_dict())
            optimizer.load_state_dict(copy.deepcopy(sync_opt.state_dict()))
    return {f"net.{name}": p.detach() for name, p in replicas[0].named_parameters()}


@pytest.mark.parametrize("delay, momentum, scheduler, adam", [(1, 0.9, False, False), (2, 0.9, True, False),
                                                              (3, 0.0, False, False), (2, 0.0, False, True)],
                         ids=["d1-momentum", "d2-momentum-scheduler", "d3-sgd", "d2-adam"])
def test_dga_equals_its_definition(tmp_path, delay, momentum, scheduler, adam):
    args = ["--strategy", "asgd", "--delay", str(delay), "--batch-size", "16", "--epochs", str(EPOCHS),
            "--momentum", str(momentum), *(["--scheduler"] if scheduler else []), *(["--adam", "--lr", "0.01"] if adam else [])]
    proc = run_train_script(tmp_path, *args)
    if adam:
        global LR
        saved, LR = LR, 0.01
        try:
            expected = dga_reference(delay, adam=True)
        finally:
            LR = saved
    else:
        expected = dga_reference(delay, momentum, halve_lr_each_epoch=scheduler)
    check_against(tmp_path, expected, atol=2e-5 if adam else 1e-6)  # Adam: the rounding of its steps taken again
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["pushed"] == summary["applied"] == summary["global_step"] == 8 * EPOCHS  # one step a batch, as DDP
    assert summary["momentum"] == (None if adam else momentum) and "momentum_correction" not in proc.stderr  # kept


@pytest.mark.parametrize("strategy", [["--strategy", "asgd", "--delay", "1"],
                                      ["--strategy", "local_sgd", "--sync-every", "4", "--delay", "1"]],
                         ids=["delayed_averaging", "local_sgd"])
def test_no_collective_between_exchanges(tmp_path, strategy):
    """From the first training batch to the last, a rank issues its exchanges' all-reduces on the
    exchange's group and nothing else: no per-batch stop agreement, no other meeting (8 batches of 16 per
    rank and epoch: 8 gradient exchanges, or 2 rounds of 4 steps)."""
    run_train_script(tmp_path, *strategy, "--batch-size", "16", "--epochs", "2", "--count-collectives")
    exchanges = 8 * 2 if strategy[1] == "asgd" else 2 * 2
    for rank in (0, 1):
        counts = json.loads((tmp_path / f"collectives_rank{rank}.json").read_text())
        assert counts == {"all_reduce@exchange": exchanges}, counts


def test_a_stop_on_rank_1_between_an_exchange_and_its_correction_resumes_exactly(tmp_path):
    """Delay 2, SIGTERM to rank 1 alone after batch 0 of epoch 1: the request rides on rank 1's next
    exchange, both ranks stop when it is applied, at the same step, with two exchanges in flight; the
    checkpoint holds each rank's own weights, momentum and pending exchanges, and the same command run
    again ends where the uninterrupted run does."""
    from preemption_runs import callbacks, run

    settings = ("strategy=delayed_averaging", "strategy.delay=2", "strategy.fork_ranks=true", "trainer.devices=2",
                "optimizer.momentum=0.9", "data.num_train=2048", "trainer.limit_train_batches=10")  # 10 of 16 batches
    interrupted = (*settings, f"hydra.run.dir={tmp_path / 'run'}", *callbacks(tmp_path, "resumed", epoch=1, batch=0, rank=1))
    stopped = run(*interrupted, cwd=tmp_path)
    output = stopped.stdout + stopped.stderr
    assert stopped.returncode == 143 and "last-interrupted.ckpt" in stopped.stdout, output[-3000:]
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "last-interrupted.ckpt", weights_only=False)
    ranks = checkpoint[DelayedAveragingStrategy.rank_states_key]["ranks"]
    assert [len(own["pending"]) for _, _, own in ranks] == [2, 2], "stopped with two exchanges in flight"
    assert checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["completed"] == 4, \
        "asked after batch 0, the stop rides on batch 1's exchange, which is applied after batch 3; 6 batches to go"
    resumed = run(*interrupted, cwd=tmp_path)
    assert resumed.returncode == 0 and "resumed in epoch 2" in resumed.stdout + resumed.stderr, resumed.stderr[-3000:]
    reference = run(*settings, f"hydra.run.dir={tmp_path / 'reference'}", *callbacks(tmp_path, "reference"), cwd=tmp_path)
    assert reference.returncode == 0, reference.stderr[-3000:]
    got, expected = torch.load(tmp_path / "resumed.pt"), torch.load(tmp_path / "reference.pt")
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6, msg=name)
