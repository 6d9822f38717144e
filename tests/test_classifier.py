"""ClassifierModule with a single-process Trainer: learning, optimizer/scheduler factories, checkpoints."""

from __future__ import annotations

from functools import partial

import pytest
import pytorch_lightning as pl
import torch

from lightning_hybrid import ClassifierModule
from lightning_hybrid.data import SyntheticMNISTDataModule
from lightning_hybrid.models import MLP, LeNet5


def trainer(tmp_path, **kwargs) -> pl.Trainer:
    defaults = dict(
        accelerator="cpu", devices=1, max_epochs=2, default_root_dir=tmp_path, enable_progress_bar=False,
        enable_model_summary=False, logger=False, num_sanity_val_steps=0,
    )
    return pl.Trainer(**{**defaults, **kwargs})


def small_data(**kwargs) -> SyntheticMNISTDataModule:
    return SyntheticMNISTDataModule(**{"num_train": 512, "num_val": 128, "num_test": 128, "batch_size": 32, **kwargs})


def test_learns_synthetic_data_and_reports_metrics(tmp_path):
    pl.seed_everything(0)
    module = ClassifierModule(MLP(activation="relu"), optimizer=partial(torch.optim.Adam, lr=1e-3))
    t = trainer(tmp_path)
    t.fit(module, datamodule=small_data())
    assert {"train/loss", "train/acc", "val/loss", "val/acc"} <= set(t.callback_metrics)
    (result,) = t.test(module, datamodule=small_data(), verbose=False)
    assert set(result) == {"test/loss", "test/acc"}
    assert result["test/acc"] > 0.9, result


def test_predict_returns_classes(tmp_path):
    module = ClassifierModule(LeNet5())
    predictions = trainer(tmp_path).predict(module, datamodule=small_data())
    flat = torch.cat(predictions)
    assert flat.shape == (128,) and flat.dtype == torch.int64 and int(flat.max()) < 10


def test_scheduler_factory_and_mapping(tmp_path):
    step = partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5)
    for scheduler in (step, {"scheduler": step, "interval": "epoch"}):
        module = ClassifierModule(MLP(), optimizer=partial(torch.optim.SGD, lr=0.1), scheduler=scheduler)
        t = trainer(tmp_path, max_epochs=3, limit_train_batches=2, limit_val_batches=1)
        t.fit(module, datamodule=small_data())
        assert t.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)


def test_bad_arguments():
    with pytest.raises(TypeError, match="scheduler must be a factory"):
        ClassifierModule(MLP(), scheduler={"interval": "epoch"})
    with pytest.raises(ValueError, match="pass num_classes="):
        ClassifierModule(torch.nn.Linear(3, 2))
    assert ClassifierModule(torch.nn.Linear(3, 2), num_classes=2).num_classes == 2


def test_checkpoint_resume_continues_the_run(tmp_path):
    """Fit 2 epochs, then resume from the checkpoint for 2 more: the same result as 4 epochs straight."""

    def run(max_epochs, ckpt_path=None, root=tmp_path):
        pl.seed_everything(0)
        module = ClassifierModule(MLP(), optimizer=partial(torch.optim.SGD, lr=0.05, momentum=0.9))
        t = trainer(root, max_epochs=max_epochs, limit_val_batches=1, deterministic=True)
        t.fit(module, datamodule=small_data(), ckpt_path=ckpt_path)
        return t, module

    t2, _ = run(2)
    ckpt = tmp_path / "two.ckpt"
    t2.save_checkpoint(ckpt)
    assert torch.load(ckpt, weights_only=True)["epoch"] == 2  # loads without trusting pickles
    _, resumed = run(4, ckpt_path=str(ckpt))
    _, straight = run(4, root=tmp_path / "straight")
    for (name, a), b in zip(resumed.state_dict().items(), straight.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
