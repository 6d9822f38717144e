"""Heterogeneity simulation: the stretching arithmetic, reproducible stragglers, and real slowed steps."""

from __future__ import annotations

import time
from functools import partial

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


def test_inactive_by_default():
    assert not HeterogeneitySimulator().active
    assert not HeterogeneitySimulator(slowdown=[1.0, 1.0]).active
    assert HeterogeneitySimulator(slowdown=[1.0, 2.0]).active
    assert HeterogeneitySimulator(straggle_prob=0.1).active


def test_slowdown_stretches_the_step_time_by_its_factor(tmp_path):
    pl.seed_everything(0)
    timer, sim = EpochTimer(), HeterogeneitySimulator(slowdown=[3.0])
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=20, limit_val_batches=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[sim, timer],
        default_root_dir=tmp_path,
    )
    dm = SyntheticMNISTDataModule(num_train=20 * 128, num_val=8, num_test=8, batch_size=128)
    trainer.fit(ClassifierModule(LeNet5(), optimizer=partial(torch.optim.SGD, lr=0.01)), datamodule=dm)
    slept, epoch = sim.stretcher.slept, timer.epoch_times[-1]
    assert sim.stretcher.steps == 20
    # Each step sleeps twice what it measured, so an epoch is 3x its steps' compute plus the loop around them.
    assert 1.6 < slept / (epoch - slept) <= 2.0 + 1e-6, (slept, epoch)


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

    class _SlowsItsCompute:
        factor = None

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

