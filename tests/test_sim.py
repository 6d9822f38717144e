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
