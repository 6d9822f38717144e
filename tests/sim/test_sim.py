"""Heterogeneity simulation: the stretching arithmetic, reproducible stragglers, and real slowed steps."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from lightning_hybrid import ClassifierModule
from lightning_hybrid.callbacks import EpochTimer
from lightning_hybrid.data import SyntheticMNISTDataModule
from lightning_hybrid.models import LeNet5
from lightning_hybrid.callbacks import HeterogeneitySimulator
from lightning_hybrid.sim import StepStretcher


def test_extra_time_is_factor_minus_one_times_elapsed():
    assert StepStretcher(factor=4.0).extra_time(0.5) == pytest.approx(1.5)
    assert StepStretcher(factor=1.0).extra_time(0.5) == 0.0


def test_stragglers_are_seeded_and_have_the_requested_rate():
    def draws(seed):
        s = StepStretcher(factor=1.0, straggle_prob=0.2, straggle_factor=3.0, seed=seed)
        return [s.extra_time(1.0) for _ in range(2000)], s

    a, sa = draws((7, 1))
    b, _ = draws((7, 1))
    c, _ = draws((7, 2))
    assert a == b and a != c
    assert set(a) == {0.0, 2.0}
    assert 0.15 < sa.stragglers / sa.steps < 0.25


def test_stretch_sleeps():
    s = StepStretcher(factor=3.0)
    start = time.perf_counter()
    slept = s.stretch(0.05)
    assert slept == pytest.approx(0.1) and time.perf_counter() - start >= 0.095 and s.slept == pytest.approx(0.1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(slowdown=[1.0, 0.5]), "slowed, not sped up"),
        (dict(straggle_prob=1.5), "probability"),
        (dict(straggle_prob=0.1, straggle_factor=0.5), "straggle_factor"),
        (dict(where="optimizer"), "where must be one of 'compute', 'after_step', 'data'"),
        (dict(affinity=[None, [999]]), "not all among this machine's usable cores"),
        (dict(cpu_share=[0.5, 0.0]), "positive number of cores"),
    ],
)
def test_bad_settings_fail_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HeterogeneitySimulator(**kwargs)


def test_world_size_mismatch_says_how_to_fix():
    sim = HeterogeneitySimulator(slowdown=[1.0, 4.0])
    sim.check_world_size(2)
    with pytest.raises(ValueError, match=r"2 factors .* 3 training ranks.*sim.slowdown=\[1.0,1.0,1.0\]"):
        sim.check_world_size(3)
    with pytest.raises(ValueError, match=r"sim.affinity has 1 entries but the run has 2"):
        HeterogeneitySimulator(affinity=[[0]]).check_world_size(2)
    with pytest.raises(ValueError, match=r"sim.cpu_share has 1 entries but the run has 2.*sim.cpu_share=\[0.25,0.5\]"):
        HeterogeneitySimulator(cpu_share=[0.5]).check_world_size(2)


def test_inactive_by_default():
    assert not HeterogeneitySimulator().active
    assert not HeterogeneitySimulator(slowdown=[1.0, 1.0]).active
    assert HeterogeneitySimulator(slowdown=[1.0, 2.0]).active
    assert HeterogeneitySimulator(straggle_prob=0.1).active


class _StepWork(pl.Callback):
    """The process's CPU time from each training batch's start to its end (the simulator's measure)."""

    def __init__(self):
        self.steps, self._start = [], None

    @property
    def work(self):
        return sum(self.steps)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._start = time.process_time()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps.append(time.process_time() - self._start)


@pytest.mark.parametrize("where", ["compute", "after_step", "data"])
def test_slowdown_stretches_the_step_time_by_its_factor(tmp_path, where, request):
    """A 3x slowdown sleeps twice the rank's work (its CPU time over each step), after the step or,
    ``where="data"``, in the DataLoader's collate function; the epoch lasts that much longer."""
    pl.seed_everything(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # CPU time is the work: intra-op threads spinning while others run would add to it
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    timer, work, sim = EpochTimer(), _StepWork(), HeterogeneitySimulator(slowdown=[3.0], where=where)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=20, limit_val_batches=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[work, sim, timer], default_root_dir=tmp_path,
    )
    dm = SyntheticMNISTDataModule(num_train=20 * 128, num_val=8, num_test=8, batch_size=128)
    trainer.fit(ClassifierModule(LeNet5(), optimizer=partial(torch.optim.SGD, lr=0.01)), datamodule=dm)
    slept, epoch = sim.stretcher.slept, timer.epoch_times[-1]
    if where == "compute":
        assert sim.stretcher.steps == 20
        assert slept == pytest.approx(2.0 * work.work, rel=0.1), (slept, work.work)
    else:
        # Each batch sleeps twice the work per sample measured so far (the median of the first steps after
        # the first, which warms up); batches before the second step's end sleep nothing.
        after_warmup = sum(work.steps[1:])
        assert 20 <= sim.stretcher.steps <= 21 and 1.5 * after_warmup < slept < 2.5 * after_warmup, (slept, work.steps)
        assert "process_dataloader" not in vars(trainer.strategy)  # the strategy is itself again
    assert epoch > slept + work.work * 0.9, (epoch, slept, work.work)


class _SlowValidation(ClassifierModule):
    def validation_step(self, batch, batch_idx):
        time.sleep(0.3)
        return super().validation_step(batch, batch_idx)


def test_epoch_timer_training_clock_leaves_validation_out(tmp_path):
    pl.seed_everything(0)
    timer = EpochTimer()
    logger = pl.loggers.CSVLogger(tmp_path)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=2, limit_train_batches=4, limit_val_batches=2, logger=logger,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[timer],
        num_sanity_val_steps=0,
    )
    dm = SyntheticMNISTDataModule(num_train=4 * 32, num_val=64, num_test=8, batch_size=32)
    trainer.fit(_SlowValidation(LeNet5(), optimizer=partial(torch.optim.SGD, lr=0.01)), datamodule=dm)
    metrics = trainer.logged_metrics  # the last epoch's: two validations of two slow batches each so far
    elapsed, training = float(metrics["time/elapsed_s"]), float(metrics["time/training_s"])
    assert elapsed - training >= 4 * 0.3, (elapsed, training)
    assert 0 < training < elapsed - 4 * 0.3 + 0.5, (elapsed, training)


def test_log_names_each_ranks_factor_also_where_the_strategy_slows_its_compute(caplog):
    """The hybrid strategy slows its stages itself; the log still gives each rank's real factor."""
    from types import SimpleNamespace

    from lightning_hybrid.strategies.capabilities import Capabilities

    class _SlowsItsCompute(Capabilities):  # a strategy that says it slows its own compute (Capabilities)
        factor = None
        slows_its_compute = True
        root_device = torch.device("cpu")

        def inject_compute_slowdown(self, factor):
            self.factor = factor

    for rank, expected in ((0, "x2.00"), (1, "x1.00")):
        strategy = _SlowsItsCompute()
        trainer = SimpleNamespace(world_size=2, global_rank=rank, strategy=strategy)
        sim = HeterogeneitySimulator(slowdown=[2.0, 1.0])
        with caplog.at_level("INFO", logger="lightning_hybrid.callbacks"):
            caplog.clear()
            sim.setup(trainer, None, "fit")
        assert strategy.factor == [2.0, 1.0][rank]
        assert sim.stretcher.factor == 1.0  # not stretched twice
        assert f"rank {rank}: simulated slowdown {expected} (on _SlowsItsCompute's compute)" in caplog.text


def test_progress_log_writes_occasional_lines(tmp_path, caplog):
    from lightning_hybrid.callbacks import ProgressLog

    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=2, limit_train_batches=3, limit_val_batches=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[ProgressLog(every_s=0.0)], default_root_dir=tmp_path,
    )
    dm = SyntheticMNISTDataModule(num_train=3 * 16, num_val=8, num_test=8, batch_size=16)
    with caplog.at_level("INFO", logger="lightning_hybrid.callbacks"):
        trainer.fit(ClassifierModule(LeNet5(), optimizer=partial(torch.optim.SGD, lr=0.01)), datamodule=dm)
    lines = [r.getMessage() for r in caplog.records if r.name == "lightning_hybrid.callbacks"]
    assert len(lines) == 2 * (3 + 1), lines  # every batch (every_s=0), and each epoch's end
    assert lines[0].startswith("epoch 1/2  batch 1/3 (33%)") and "samples/s" in lines[0] and "train/loss" in lines[0]
    assert lines[-1].startswith("epoch 2/2  done")



def test_slow_batches_sleep_per_sample_of_the_measured_work():
    from multiprocessing import Value

    from lightning_hybrid.sim import SlowBatches

    per_sample = Value("d", 0.0)
    stretcher = StepStretcher(factor=3.0)
    collate = SlowBatches(list, stretcher, per_sample)
    assert collate([1, 2]) == [1, 2] and stretcher.slept == 0.0  # nothing measured yet
    per_sample.value = 0.01
    start = time.perf_counter()
    assert collate([1, 2, 3]) == [1, 2, 3]
    assert stretcher.slept == pytest.approx(0.06) and time.perf_counter() - start >= 0.055


def _allowed_cores(pid: int) -> str:
    status = open(f"/proc/{pid}/status").read()
    return next(line.split(":")[1].strip() for line in status.splitlines() if line.startswith("Cpus_allowed_list"))


def test_competitor_pins_busy_processes_and_comes_and_goes(tmp_path):
    """Real contention: busy processes pinned to a core, always or in random spells (SIGSTOP/SIGCONT)."""
    import os

    from lightning_hybrid.sim import Competitor

    core = max(os.sched_getaffinity(0))
    with Competitor([core], processes=2) as competitor:
        pids = [p.pid for p in competitor.processes]
        time.sleep(0.3)  # they pin themselves first
        assert all(_allowed_cores(pid) == str(core) for pid in pids)
    assert all(not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read() for pid in pids)
    spells = Competitor([core], duty=0.3, period_s=0.01, seed=1).start()
    time.sleep(0.5)
    spells.stop()
    assert spells.periods > 10 and 0 < spells.busy_periods < spells.periods
    assert not spells.processes
    with pytest.raises(ValueError, match="duty"):
        Competitor([core], duty=0.0)


_SPIN_IN_A_SHARE = """
import time
from lightning_hybrid.sim.cpu_share import CpuShare
share = CpuShare(0.25, "test")
try:
    share.open()
except OSError as error:
    print("unavailable:", error)
    raise SystemExit(0)
stat = share.group / "cpu.stat"
end = time.perf_counter() + 0.3
while time.perf_counter() < end:
    pass
throttled = dict(line.split() for line in stat.read_text().splitlines())["nr_throttled"]
share.close()
print(throttled, share.group.exists())
"""


def test_a_cpu_share_is_a_quota_the_kernel_enforces_and_its_group_goes_with_it():
    """A busy process in a share of a quarter of a core is throttled by the scheduler (the kernel counts it);
    leaving moves it back and removes its group, and the next share removes one a killed run left. Without a writable CPU cgroup the error says what to do."""
    from lightning_hybrid.sim.cpu_share import CpuShare, _hierarchy

    root = _hierarchy()
    if not os.access(root, os.W_OK):
        pytest.skip(f"no writable CPU cgroup hierarchy at {root} (sim.cpu_share needs root)")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = root / "lightning_hybrid" / f"rank0-{dead.pid}"  # left by a run killed inside its share
    live = root / "lightning_hybrid" / f"rank1-{os.getpid()}"  # another run's, just made: not touched
    stale.mkdir(parents=True, exist_ok=True)
    live.mkdir(exist_ok=True)
    output = subprocess.run([sys.executable, "-c", _SPIN_IN_A_SHARE], capture_output=True, text=True, check=True).stdout
    if output.startswith("unavailable:"):
        live.rmdir()
        pytest.skip(output.strip())  # e.g. cgroup v2 inside a container: controllers not delegated
    out = output.split()
    assert int(out[0]) > 0 and out[1] == "False", out
    assert not stale.exists() and live.exists()  # a group whose process is gone is removed by the next share made
    live.rmdir()
    with pytest.raises(OSError, match="sim.cpu_share needs a writable CPU control group hierarchy.*sim.slowdown instead"):
        CpuShare(0.5, "test", root=Path("/proc/no-such-hierarchy")).open()
