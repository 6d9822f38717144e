"""BalancedDataParallelStrategy: the share arithmetic, the schedule and the sampler without processes;
then real gloo processes through tests/support/train_script.py (and the CLI) against one process on the
global batch, with shares given, measured and changed mid-epoch, and resumed from a checkpoint."""

from __future__ import annotations

import json
import math
from functools import partial

import pytest
import pytorch_lightning as pl
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader

from conftest import run_cli, run_train_script
from lightning_hybrid import BalancedDataParallelStrategy, ClassifierModule
from lightning_hybrid.balance import (
    BalancedBatchSampler,
    CycleClock,
    Meter,
    ShareSchedule,
    SpeedEstimator,
    agreed_start,
    apportion,
)
from lightning_hybrid.data import SyntheticMNISTDataModule
from lightning_hybrid.data.base import EpochSeededRandomSampler
from lightning_hybrid.data.synthetic_mnist import synthetic_classification
from lightning_hybrid.models import MLP
from lightning_hybrid.strategies.balanced import STATE_KEY

SAMPLES = 256  # train_script.py's dataset


def load(path):
    return torch.load(path, weights_only=False)


# ---------------------------------------------------------------------- shares, schedule, sampler (no processes)
@pytest.mark.parametrize(
    "total, speeds, min_share, want",
    [
        (32, [1, 3], 1, [8, 24]),
        (48, [1, 2, 3], 1, [8, 16, 24]),
        (16, [8, 16, 24], 1, [3, 5, 8]),  # 2.67, 5.33, 8: the one left over goes to the largest remainder
        (10, [1, 1, 1], 1, [4, 3, 3]),  # equal remainders: the lower rank
        (10, [1, 100], 1, [1, 9]),  # a rank rounded to zero gets min_share
        (20, [1, 1, 100], 3, [3, 3, 14]),
        (7, [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5], 1, [1] * 7),
    ],
)
def test_apportion(total, speeds, min_share, want):
    shares = apportion(total, speeds, min_share)
    assert shares == want and sum(shares) == total and min(shares) >= min_share


def test_shares_change_only_when_the_step_gets_shorter_by_more_than_the_tolerance():
    from lightning_hybrid.balance import apportion, step_time, worth_changing

    equal = [64, 64]
    noisy = [1.04, 0.96]  # two equal devices, measured with 4% noise
    proposed = apportion(128, noisy)
    assert proposed != equal and step_time(proposed, noisy) < step_time(equal, noisy)  # a little shorter...
    assert not worth_changing(equal, proposed, noisy, tolerance=0.05)  # ...but within the noise: keep
    assert worth_changing(equal, proposed, noisy, tolerance=0.0)
    straggler = [4.0, 1.0]
    assert worth_changing(equal, apportion(128, straggler), straggler, tolerance=0.05)
    assert step_time([102, 26], straggler) == pytest.approx(26.0)


def test_apportion_is_proportional_within_one_sample():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        ranks = int(torch.randint(1, 9, (1,), generator=gen))
        speeds = (torch.rand(ranks, generator=gen) * 10 + 0.01).tolist()
        total = int(torch.randint(ranks, 500, (1,), generator=gen))
        shares = apportion(total, speeds)
        assert sum(shares) == total and min(shares) >= 1
        ideal = [total * s / sum(speeds) for s in speeds]
        assert all(share >= 1 and (share == 1 or abs(share - q) < 1) for share, q in zip(shares, ideal)), (shares, ideal)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: apportion(32, [1.0, 0.0]), "positive finite"),
        (lambda: apportion(32, [1.0, -2.0]), "positive finite"),
        (lambda: apportion(32, [1.0, math.nan]), "positive finite"),
        (lambda: apportion(32, [1.0, math.inf]), "positive finite"),
        (lambda: apportion(32, ["fast", 1.0]), "positive"),
        (lambda: apportion(2, [1.0, 1.0, 1.0]), "smaller than the number of ranks"),
        (lambda: apportion(5, [1.0, 1.0, 1.0], min_share=2), "min_share=2"),
        (lambda: apportion(8, [1.0, 1.0], min_share=0), "min_share must be a positive integer"),
    ],
)
def test_apportion_refuses(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_schedule_changes_only_where_no_batch_was_dealt():
    schedule = ShareSchedule([16, 16])
    for step in range(3):  # dealt ahead of training: steps 0-2 on this rank, 0-4 on another
        schedule.dealt(0, step)
    start = agreed_start([schedule.frontier, (0, 5)])
    assert start == (0, 5)
    schedule.change(start, [8, 24])
    assert [schedule.shares_at(0, k) for k in (0, 4, 5, 7)] == [(16, 16), (16, 16), (8, 24), (8, 24)]
    assert schedule.shares_at(1, 0) == (8, 24)
    with pytest.raises(RuntimeError, match="already dealt"):
        schedule.change((0, 2), [4, 28])
    with pytest.raises(ValueError, match="do not sum"):
        schedule.change((0, 9), [4, 4])
    schedule.change((0, 8), [4, 28])  # past the epoch's last step: in force from the next epoch
    assert schedule.shares_at(0, 7) == (8, 24) and schedule.shares_at(1, 0) == (4, 28)
    saved = schedule.state_dict()
    schedule.compact((1, 0))
    assert schedule.changes == [((0, 8), (4, 28))] and schedule.shares_at(1, 3) == (4, 28)
    restored = ShareSchedule([1, 31])
    restored.load_state_dict(saved)
    assert [restored.shares_at(0, k) for k in (0, 5, 8)] == [(16, 16), (8, 24), (4, 28)]


def test_sampler_deals_the_single_process_batches_and_each_sample_once():
    """Three ranks with shares changing mid-epoch, each DataLoader drawing a different number of
    batches ahead: every step, the ranks' slices put together are the global batch one process with
    batch 32 and EpochSeededRandomSampler sees; the last incomplete batch (100 = 3 x 32 + 4) is split
    in proportion; every sample is used once per epoch."""
    schedule = [ShareSchedule([5, 9, 18]) for _ in range(3)]  # each process has its own copy
    samplers = [BalancedBatchSampler(100, r, schedule[r], seed=7) for r in range(3)]
    single = EpochSeededRandomSampler(range(100), seed=7)
    for epoch in range(2):
        for s in samplers:
            s.set_epoch(epoch)
        single.set_epoch(epoch)
        order = list(single)
        iterators = [iter(s) for s in samplers]
        dealt = [[next(it) for _ in range(1 + r)] for r, it in enumerate(iterators)]  # prefetch depths 1, 2, 3
        if epoch == 0:  # after training step 0, all ranks decide: the change starts at the deepest frontier
            start = agreed_start([s.frontier for s in schedule])
            assert start == (0, 3)
            for s in schedule:
                s.change(start, [12, 12, 8])
        for r, it in enumerate(iterators):
            dealt[r] += list(it)
        assert [len(d) for d in dealt] == [4, 4, 4] == [len(s) for s in samplers]
        for step in range(4):
            parts = [dealt[r][step] for r in range(3)]
            assert sum(parts, []) == order[step * 32 : (step + 1) * 32]
            assert [len(p) for p in parts] == list(samplers[0].shares(epoch, step))
        assert [len(dealt[r][3]) for r in range(3)] == [2, 1, 1]  # 4 samples in proportion to 12:12:8
        assert [len(dealt[r][0]) for r in range(3)] == ([5, 9, 18] if epoch == 0 else [12, 12, 8])
        assert sorted(sum((sum(d, []) for d in dealt), [])) == list(range(100))
        assert [list(e)[:3] for e in samplers[2].dealt] == [[epoch, k, len(dealt[2][k])] for k in range(4)]


def test_a_change_at_the_frontier_of_a_prefetching_dataloader():
    """A DataLoader with two workers draws batch indices ahead; a change decided after the first batch
    starts where the sampler has not dealt yet, and the trainer's queue of dealt batches matches the
    batches in the order they arrive."""
    schedule = ShareSchedule([8, 24])
    sampler = BalancedBatchSampler(256, 1, schedule, seed=0)
    loader = DataLoader(torch.arange(256), batch_sampler=sampler, num_workers=2, prefetch_factor=2)
    received, taken = [], []
    for batch in loader:
        if not received:
            start = agreed_start([schedule.frontier])
            assert start[1] > 1, "the workers drew batches ahead"
            schedule.change(start, [20, 12])
        received.append(batch.tolist())
        taken.append(sampler.dealt.popleft())
    assert [d.step for d in taken] == list(range(8)) and not sampler.dealt
    assert [len(b) for b in received] == [24] * start[1] + [12] * (8 - start[1])
    assert [d.samples for d in taken] == [len(b) for b in received]
    assert received == [step[1] for step in sampler.slices(0)]


def test_sampler_drops_a_tail_smaller_than_the_ranks_and_with_drop_last():
    assert BalancedBatchSampler(66, 0, ShareSchedule([16, 16, 32])).dropped == 2  # 2 samples for 3 ranks
    sampler = BalancedBatchSampler(70, 0, ShareSchedule([16, 16, 32]), drop_last=True)
    assert len(sampler) == 1 and sampler.dropped == 6
    assert len(BalancedBatchSampler(70, 0, ShareSchedule([16, 16, 32]))) == 2


def test_speed_estimates_and_cycle_clock():
    estimator = SpeedEstimator(smoothing=0.25)
    assert estimator.update([10, 10], [1.0, 0.0]) is None  # a rank that measured nothing
    assert estimator.update([10, 40], [1.0, 1.0]) == [10.0, 40.0]
    assert estimator.update([10, 40], [1.0, 2.0]) == [10.0, 35.0]
    meter = Meter()
    meter.add(8, 0.5, 0.1)
    meter.add(8, 0.5, 0.1)
    assert meter.take() == (16, 1.0, 0.2) and meter.take() == (0, 0, 0)

    now, slept = [0.0], []
    clock = CycleClock(slowdown=3.0, now=lambda: now[0], sleep=lambda s: (slept.append(s), now.__setitem__(0, now[0] + s)))
    clock.start()
    now[0] = 0.1  # backward produced the last bucket: 0.1 s of compute, stretched to 0.3 s before its all-reduce
    clock.last_bucket_ready()
    now[0] += 0.05  # the all-reduce returns 0.05 s later: waiting
    assert slept == [pytest.approx(0.2)]
    assert clock.backward_done() == (pytest.approx(0.3), pytest.approx(0.05))
    assert clock.backward_done() is None  # an accumulating batch's backward exchanges nothing


def test_cycle_clock_counts_the_whole_cycle_but_the_wait():
    """Time spent after the all-reduce (optimizer step, a slow callback, the next batch's loading) is the
    rank's own; waiting for the others is not, so it cannot inflate the measurement that decides it."""
    now = [0.0]
    clock = CycleClock(now=lambda: now[0])
    clock.start()
    now[0] = 0.1
    clock.last_bucket_ready()
    now[0] = 0.5  # waited 0.4 s for a slower rank
    assert clock.backward_done() == (pytest.approx(0.1), pytest.approx(0.4))
    now[0] = 0.8  # optimizer step, a callback sleeping 0.2 s, loading the next batch
    clock.start()
    now[0] = 0.9
    clock.last_bucket_ready()
    now[0] = 0.95
    assert clock.backward_done() == (pytest.approx(0.4), pytest.approx(0.05))  # 0.3 s before the batch + 0.1 s
    now[0] = 5.0  # validation, then the next epoch: not this rank's own time
    clock.interrupt()
    now[0] = 6.0
    clock.start()
    now[0] = 6.1
    clock.last_bucket_ready()
    assert clock.backward_done() == (pytest.approx(0.1), pytest.approx(0.0))


# ---------------------------------------------------------------------- checks before processes start
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(speeds=[1.0, 0.0]), "positive finite"),
        (dict(speeds=[1.0, "x"]), "positive"),
        (dict(global_batch=0), "global_batch must be an integer >= 1"),
        (dict(min_share=0), "min_share must be an integer >= 1"),
        (dict(measure_steps=0), "measure_steps"),
        (dict(rebalance_every=-1), "rebalance_every"),
        (dict(smoothing=0.0), "smoothing"),
        (dict(tolerance=1.0), "tolerance"),
        (dict(tolerance=-0.1), "tolerance"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BalancedDataParallelStrategy(**kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(speeds=[1.0, 2.0]), "2 speeds for 3 ranks: give one per rank, or speeds=None"),
        (dict(global_batch=2), "global_batch=2 is smaller than the number of ranks \\(3\\)"),
        (dict(global_batch=5, min_share=2), "min_share=2"),
    ],
)
def test_bad_runs_fail_before_processes_start(kwargs, match):
    data = SyntheticMNISTDataModule(num_train=64, num_val=8, num_test=8)
    trainer = pl.Trainer(accelerator="cpu", devices=3, strategy=BalancedDataParallelStrategy(**kwargs), max_epochs=1,
                         logger=False)
    with pytest.raises(ValueError, match=match):
        trainer.fit(ClassifierModule(MLP()), datamodule=data)


def test_manual_optimization_is_refused_and_the_alias_is_registered():
    class Manual(ClassifierModule):
        def __init__(self):
            super().__init__(MLP(), optimizer=partial(torch.optim.SGD, lr=0.1))
            self.automatic_optimization = False

    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="balanced", max_epochs=1, logger=False)
    assert isinstance(trainer.strategy, BalancedDataParallelStrategy)
    with pytest.raises(ValueError, match="automatic optimization"):
        trainer.fit(Manual(), datamodule=SyntheticMNISTDataModule(num_train=64, num_val=8, num_test=8))


# ---------------------------------------------------------------------- real processes
def reference(global_batch: int, epochs: int, lr: float, momentum: float, accumulate: int = 1,
              clip: float | None = None, scheduler: bool = False) -> dict:
    """One process on the global batch, as Lightning trains it: each batch's mean loss / accumulate,
    a step every `accumulate` batches and at the epoch's end, gradient norm clipping, StepLR per epoch."""
    pl.seed_everything(0)  # as tests/support/train_script.py: the same initial weights
    net = MLP(activation="relu")
    params = list(net.parameters())
    optimizer = torch.optim.SGD(params, lr=lr, momentum=momentum)
    steps_lr = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5) if scheduler else None
    x, y = synthetic_classification(SAMPLES, (1, 28, 28), 10, seed=1)
    sampler = EpochSeededRandomSampler(range(SAMPLES), seed=0)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        order = list(sampler)
        batches = [order[i : i + global_batch] for i in range(0, SAMPLES, global_batch)]
        optimizer.zero_grad()
        for k, idx in enumerate(batches):
            (F.cross_entropy(net(x[idx]), y[idx]) / accumulate).backward()
            if (k + 1) % accumulate == 0 or k == len(batches) - 1:
                if clip is not None:
                    torch.nn.utils.clip_grad_norm_(params, clip)
                optimizer.step()
                optimizer.zero_grad()
        if steps_lr is not None:
            steps_lr.step()
    return {f"net.{name}": p.detach() for name, p in net.named_parameters()}


def check_run(out, ranks: int, global_batch: int, epochs: int, expected: dict, changes: list[dict]) -> None:
    """Every rank ends with the reference's parameters; each epoch each rank trained on exactly its slice
    of every global batch under the shares in force (given, then the recorded changes), every sample once."""
    params = [load(out / f"rank{r}.pt") for r in range(ranks)]
    for name, want in expected.items():
        for r in range(1, ranks):
            torch.testing.assert_close(params[r][name], params[0][name], rtol=0, atol=0, msg=f"rank {r} differs on {name}")
        torch.testing.assert_close(params[0][name], want, rtol=1e-5, atol=1e-6, msg=name)
    batches = [load(out / f"batches_rank{r}.pt") for r in range(ranks)]
    schedule = ShareSchedule(changes[0]["shares"])
    for change in changes[1:]:
        schedule.change((change["epoch"], change["step"]), change["shares"])
    sampler = BalancedBatchSampler(SAMPLES, 0, schedule, seed=0)
    for epoch in sorted(batches[0]):
        expected_slices = list(sampler.slices(epoch))
        for r in range(ranks):
            assert batches[r][epoch] == [step[r] for step in expected_slices], f"rank {r}, epoch {epoch}"
        assert sorted(i for b in batches for step in b[epoch] for i in step) == list(range(SAMPLES))


@pytest.mark.multiprocess
def test_three_ranks_with_given_shares_equal_one_process(tmp_path):
    """Speeds 1:2:3 with the default global batch (16 x 3 = 48: shares 8, 16, 24; the last batch of
    256 = 5 x 48 + 16 split 3, 5, 8), with momentum, accumulation over 2 batches, clipping and a StepLR."""
    run_train_script(tmp_path, "--strategy", "balanced", "--devices", "3", "--speeds", "1,2,3", "--batch-size", "16",
                     "--epochs", "2", "--lr", "0.05", "--momentum", "0.9", "--accumulate", "2", "--clip", "0.5",
                     "--scheduler")
    expected = reference(48, 2, lr=0.05, momentum=0.9, accumulate=2, clip=0.5, scheduler=True)
    check_run(tmp_path, 3, 48, 2, expected, [{"shares": [8, 16, 24]}])
    balanced = json.loads((tmp_path / "balanced.json").read_text())
    assert balanced["changes"] == []
    assert [e["shares"] for e in balanced["history"]] == [[8, 16, 24]] * 2
    assert [e["samples"] for e in balanced["history"]] == [[5 * 8 + 3, 5 * 16 + 5, 5 * 24 + 8]] * 2
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["lr"] == pytest.approx(0.05 * 0.5**2) and summary["global_step"] == 2 * 3 and summary["val_acc"] > 0.5


@pytest.mark.multiprocess
def test_shares_measured_and_changed_mid_epoch_equal_one_process_and_resume(tmp_path):
    """Two ranks start with shares 8:24 although rank 1 computes four times slower (simulated inside
    the measured compute); after measuring, the shares change mid-epoch, towards rank 0. One process
    on the global batch ends with the same parameters. Resuming from the epoch-1 checkpoint restores
    the shares in force and ends where the uninterrupted run did."""
    args = ["--strategy", "balanced", "--speeds", "1,3", "--measure-steps", "2", "--rebalance-every", "3",
            "--slowdown", "1,4", "--sample-sleep", "0.0005", "--batch-size", "16", "--lr", "0.05", "--momentum", "0.9"]
    full, ckpts = tmp_path / "full", tmp_path / "ckpts"
    run_train_script(full, *args, "--epochs", "3", "--checkpoint-dir", str(ckpts))
    balanced = json.loads((full / "balanced.json").read_text())
    changes = balanced["changes"]
    assert changes and changes[0]["epoch"] == 0 and 0 < changes[0]["step"] < 8, changes  # mid-epoch
    assert all(c["shares"][0] > c["shares"][1] for c in changes), changes  # rank 0 is the fast one
    check_run(full, 2, 32, 3, reference(32, 3, lr=0.05, momentum=0.9), [{"shares": [8, 24]}, *changes])
    history = balanced["history"]
    assert history[0]["wait_s"][0] > 0 and all(s > 0 for s in history[-1]["speed"])
    assert history[-1]["speed"][0] > history[-1]["speed"][1]
    logged = balanced["logged"]
    assert {f"balanced/rank{r}/{k}" for r in (0, 1) for k in ("share", "speed", "wait_s", "busy_s")} <= set(logged)
    assert logged["balanced/rank0/share"] == history[-1]["shares"][0]

    state = torch.load(ckpts / "epoch=1.ckpt", weights_only=True)[STATE_KEY]
    saved = ShareSchedule([1, 31])
    saved.load_state_dict(state["schedule"])
    in_force = [c["shares"] for c in changes if (c["epoch"], c["step"]) <= (2, 0)][-1]
    assert list(saved.shares_at(2, 0)) == in_force
    resumed = tmp_path / "resumed"
    run_train_script(resumed, *args, "--epochs", "3", "--resume", str(ckpts / "epoch=1.ckpt"))
    assert set(load(resumed / "batches_rank0.pt")) == {2}
    first_step = load(resumed / "batches_rank0.pt")[2][0], load(resumed / "batches_rank1.pt")[2][0]
    assert [len(b) for b in first_step] == in_force  # the shares in force were restored
    params = load(full / "rank0.pt")
    for name, value in load(resumed / "rank0.pt").items():
        torch.testing.assert_close(value, params[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.multiprocess
@pytest.mark.parametrize("slow_by", ["callback", "data"])
def test_shares_follow_a_rank_slow_outside_its_compute(tmp_path, slow_by):
    """Rank 1 is four times slower, not in its forward and backward but in a user's callback that
    sleeps after each of its steps, or in its own dataset's reads: its whole cycle is what counts,
    so it ends with about a fifth of the global batch (32 / 5 = 6.4), and the run still equals one
    process on the global batch."""
    run_train_script(tmp_path, "--strategy", "balanced", "--measure-steps", "2", "--rebalance-every", "4",
                     "--sample-sleep", "0.002", "--slow-rank", "1", "--slow-by", slow_by, "--slow-per-sample", "0.006",
                     "--batch-size", "16", "--epochs", "3", "--lr", "0.05", "--momentum", "0.9")
    balanced = json.loads((tmp_path / "balanced.json").read_text())
    changes, history = balanced["changes"], balanced["history"]
    assert changes and changes[0]["epoch"] == 0, changes
    assert 4 <= history[-1]["shares"][1] <= 9, history[-1]  # about a fifth of 32
    assert history[-1]["speed"][0] > 2.5 * history[-1]["speed"][1], history[-1]
    check_run(tmp_path, 2, 32, 3, reference(32, 3, lr=0.05, momentum=0.9), [{"shares": [16, 16]}, *changes])


@pytest.mark.multiprocess
@pytest.mark.parametrize("where", ["after_step", "data"])
def test_shares_follow_the_simulators_slowdown_wherever_it_puts_the_time(tmp_path, where):
    """``sim.where``: the simulator's 4x slowdown after each step or in the DataLoader moves the shares
    towards the fast rank, as one inside the compute does. (The simulator stretches the rank's CPU
    time, here mostly Lightning's own per-step work, which does not shrink with the share: the slow
    rank's share shrinks further than a fifth.)"""
    run_train_script(tmp_path, "--strategy", "balanced", "--measure-steps", "2", "--rebalance-every", "4",
                     "--slowdown", "1,4", "--sim-where", where, "--batch-size", "16", "--epochs", "2", "--lr", "0.05")
    history = json.loads((tmp_path / "balanced.json").read_text())["history"]
    shares, speeds = history[-1]["shares"], history[-1]["speed"]
    assert 3 * shares[1] < shares[0] and speeds[0] > 2.5 * speeds[1], history[-1]


@pytest.mark.multiprocess
def test_balanced_through_the_cli_with_bf16(tmp_path):
    run_dir = tmp_path / "balanced"
    run_cli(
        "experiment=smoke", "strategy=balanced", "strategy.measure_steps=1", "strategy.fork_ranks=true", "strategy.rebalance_every=2",
        "trainer.devices=2", "trainer.precision=bf16-mixed", "sim.slowdown=[1.0,3.0]", "allow_cpu_oversubscription=true",
        f"hydra.run.dir={run_dir}", cwd=tmp_path,
    )
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert {"balanced/rank0/share", "balanced/rank1/speed", "balanced/rank1/wait_s", "val/acc", "test/acc"} <= set(metrics)
    assert metrics["balanced/rank0/share"] + metrics["balanced/rank1/share"] == 128  # data.batch_size 64 x 2 ranks
