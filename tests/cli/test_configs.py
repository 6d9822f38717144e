"""Every option of every config group composes, and the objects it names instantiate."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from lightning_hybrid.cli.app import build, build_callbacks, build_module, build_strategy
from suite_configs import compose_run, suite_aliases

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GROUPS = sorted(p.name for p in CONFIGS.iterdir() if p.is_dir() and p.name != "hydra")


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def test_every_group_has_options():
    assert set(GROUPS) >= {"model", "data", "strategy", "trainer", "sim", "logger", "callbacks", "experiment"}
    for group in GROUPS:
        assert options(group), f"configs/{group} is empty"


@pytest.fixture(scope="module")
def tiny_adni_csv(tmp_path_factory):
    from lightning_hybrid.data.adni_phantoms import write_adni_phantoms

    return write_adni_phantoms(tmp_path_factory.mktemp("adni"), subjects=4, shape=(16, 16, 16))


@pytest.fixture(scope="module")
def tiny_caps(tmp_path_factory) -> Path:
    from clinicadl_cohort import make_cohort

    return make_cohort(tmp_path_factory.mktemp("clinicadl"))["caps"].parent


@pytest.mark.parametrize("group, option", [(g, o) for g in GROUPS for o in options(g)])
def test_option_composes_and_instantiates(tmp_path, group, option, tiny_adni_csv, tiny_caps):
    extra = ["trainer.devices=2"] if (group, option) in {("strategy", "ddp"), ("strategy", "ddp_spawn"), ("sim", "two_speeds")} else []
    if (group, option) in {("data", "adni"), ("experiment", "akintoye2022_adni"), ("experiment", "akintoye2022_hybrid_adni")}:
        extra.append(f"data.source.csv_path={tiny_adni_csv}")  # users point it at their ADNI CSV
    if (group, option) in {("data", "adni_phantoms"), ("data", "adni_synthetic")}:
        extra += ["data.subjects=4", "data.volume_shape=[16,16,16]"]
    if (group, option) in {("data", "adni_caps"), ("data", "adni_like")}:  # users point them at their CAPS and TSVs
        extra += [f"data.source.caps_directory={tiny_caps / 'caps'}", f"data.source.tsv_path={tiny_caps / 'split'}"]
    cfg = compose_run(tmp_path, f"{group}={option}", *extra)
    if group != "experiment":  # experiments are `# @package _global_`: they change other groups
        assert group in cfg
    build(cfg.data)
    module = build_module(cfg)
    module.trainer = None
    optimizer_config = module.configure_optimizers()
    assert isinstance(optimizer_config if isinstance(optimizer_config, torch.optim.Optimizer) else optimizer_config["optimizer"], torch.optim.Optimizer)
    callbacks = build_callbacks(cfg)
    loggers = [build(c) for c in (cfg.get("logger") or {}).values()]
    if cfg.trainer.accelerator == "gpu" and not torch.cuda.is_available():
        pytest.skip("trainer=gpu composed and its objects built, but this machine has no GPU to build the Trainer on")
    trainer = build(cfg.trainer, strategy=build_strategy(cfg.strategy), callbacks=callbacks, logger=loggers or False)
    assert isinstance(trainer, pl.Trainer)


def test_every_knob_is_reachable_by_override(tmp_path):
    cfg = compose_run(
        tmp_path, "model.activation=tanh", "optimizer.lr=0.2", "data.batch_size=7", "trainer.max_epochs=9",
        "sim.slowdown=[1.0,4.0]", "sim.straggle_prob=0.1", "scheduler=step", "scheduler.scheduler.gamma=0.1",
        "logger.csv.name=mine", "callbacks.model_checkpoint.save_top_k=3", "strategy=ddp",
        "strategy.find_unused_parameters=true", "trainer.devices=2",
    )
    assert build(cfg.data).hparams.batch_size == 7
    assert build(cfg.optimizer).keywords["lr"] == 0.2
    assert build(cfg.sim).slowdown == [1.0, 4.0]
    assert build(cfg.scheduler)["scheduler"].keywords["gamma"] == 0.1
    assert build(cfg.logger.csv).name == "mine"
    assert build_strategy(cfg.strategy)._ddp_kwargs["find_unused_parameters"] is True


@pytest.mark.parametrize("data, monitor", [("mnist", "val/acc"), ("adni_caps", "val/bacc")])
def test_checkpoints_and_early_stopping_watch_the_datamodules_metric(tmp_path, tiny_caps, data, monitor):
    """monitor: auto is the datamodule's: balanced accuracy for ADNI (the field's metric), accuracy for MNIST."""
    cfg = compose_run(tmp_path, f"data={data}", "callbacks=[model_checkpoint,early_stopping]",
                      f"data.source.caps_directory={tiny_caps / 'caps'}" if data == "adni_caps" else "data.download=false",
                      *([f"data.source.tsv_path={tiny_caps / 'split'}"] if data == "adni_caps" else []))
    watching = [c for c in build_callbacks(cfg, build(cfg.data)) if hasattr(c, "monitor")]
    assert [(c.monitor, c.mode) for c in watching] == [(monitor, "max"), (monitor, "max")]
    cfg = compose_run(tmp_path, "callbacks=[model_checkpoint]", "callbacks.model_checkpoint.monitor=val/loss")
    assert build_callbacks(cfg)[0].mode == "min"  # mode: auto follows a metric chosen by name


def test_experiment_overrides_defaults(tmp_path):
    cfg = compose_run(tmp_path, "experiment=zhang2017_lenet5_mnist")
    assert cfg.trainer.max_steps == 10000 and cfg.data.batch_size == 64
    assert cfg.model._target_.endswith("LeNet5")


@pytest.mark.parametrize("alias", sorted(suite_aliases()))
def test_every_registered_alias_has_a_config_that_builds_its_strategy(tmp_path, alias):
    """`strategy=NAME` on the command line gives what `Trainer(strategy="NAME")` gives."""
    cls, params = suite_aliases()[alias]
    cfg = compose_run(tmp_path, f"strategy={alias}")
    strategy = build_strategy(cfg.strategy)
    assert type(strategy) is cls
    for key, value in params.items():
        assert getattr(strategy, key) == value, f"strategy={alias}: {key}={getattr(strategy, key)!r}, the alias sets {value!r}"
