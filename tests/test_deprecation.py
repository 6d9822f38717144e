"""Names users typed before issue 63 keep working for a release, each warning with its new name
(:mod:`lightning_hybrid.deprecation`): classes, functions, modules cut or renamed, config options, strategy aliases,
a subcommand."""

from __future__ import annotations

import importlib

import pytest
from hydra.core.hydra_config import HydraConfig

from lightning_hybrid.deprecation import RENAMED_OPTIONS, warn_renamed_options
from suite_configs import compose_run


@pytest.mark.parametrize("module, old, new_module, new", [
    ("lightning_hybrid.watchdog", "Watchdog", "lightning_hybrid.watchdog", "StallWatchdog"),
    ("lightning_hybrid.data", "SyntheticADNIDataModule", "lightning_hybrid.data", "PhantomADNIDataModule"),
    ("lightning_hybrid.data.adni_phantoms", "write_synthetic_adni", "lightning_hybrid.data.adni_phantoms", "write_adni_phantoms"),
    ("lightning_hybrid.strategies.common", "CheckedDDPStrategy", "lightning_hybrid.strategies.checked_ddp", "CheckedDDPStrategy"),
    ("lightning_hybrid.strategies.common", "UnwrappedDDPStrategy", "lightning_hybrid.strategies.checked_ddp", "CheckedDDPStrategy"),
    ("lightning_hybrid.strategies.common", "ReplacedStep", "lightning_hybrid.strategies.replaced_step", "ReplacedStep"),
    ("lightning_hybrid.lightning.watchdog", "Watchdog", "lightning_hybrid.lightning.watchdog", "StallWatchdog"),
    ("lightning_hybrid.lightning.data", "SyntheticADNIDataModule", "lightning_hybrid.lightning.data", "PhantomADNIDataModule"),
    ("lightning_hybrid", "AllReduceASGDStrategy", "lightning_hybrid.strategies.delayed_averaging_strategy",
     "DelayedAveragingStrategy"),
    ("lightning_hybrid.strategies", "AllReduceASGDStrategy", "lightning_hybrid.strategies.delayed_averaging_strategy",
     "DelayedAveragingStrategy"),
    ("lightning_hybrid.strategies.allreduce_asgd", "AllReduceASGDStrategy",
     "lightning_hybrid.strategies.delayed_averaging_strategy", "DelayedAveragingStrategy"),
    ("lightning_hybrid.strategies.allreduce_asgd", "PENDING_KEY", "lightning_hybrid.strategies.delayed_averaging_strategy",
     "PENDING_KEY"),
    ("lightning_hybrid.lightning", "AllReduceASGDStrategy", "lightning_hybrid.lightning.strategies.delayed_averaging_strategy",
     "DelayedAveragingStrategy"),
])
def test_an_old_name_warns_with_the_new_one_and_gives_its_object(module, old, new_module, new):
    with pytest.warns(FutureWarning, match=rf"{module}\.{old} is now {new_module}\.{new}; the old name goes"):
        value = getattr(importlib.import_module(module), old)
    assert value is getattr(importlib.import_module(new_module), new)
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
        getattr(importlib.import_module(module), "NoSuchName")


@pytest.mark.parametrize("group, old, new, target", [
    ("data", "adni_synthetic", "adni_phantoms", "PhantomADNIDataModule"),
    ("strategy", "ssp", "ssp_delay", "SSPStrategy"),
    ("strategy", "allreduce_asgd", "delayed_averaging", "DelayedAveragingStrategy"),
    ("strategy", "allreduce_asgd_dc", "delayed_averaging_dc", "DelayedAveragingStrategy"),
])
def test_a_renamed_config_option_composes_as_the_new_one_and_the_command_warns(tmp_path, group, old, new, target):
    old_run = compose_run(tmp_path, f"{group}={old}")
    choices = dict(HydraConfig.get().runtime.choices)
    new_run = compose_run(tmp_path, f"{group}={new}")
    # the same config; the old data option keeps its folder (the phantoms written there before the rename)
    kept = {"root": f"${{paths.data_dir}}/{old}"} if group == "data" else {}
    assert {**new_run[group], **kept} == old_run[group] and new_run[group]._target_.endswith(target)
    assert RENAMED_OPTIONS[group][old] == new
    with pytest.warns(FutureWarning, match=f"{group}={old} is now {group}={new}"):
        warn_renamed_options(choices)


@pytest.mark.parametrize("flavour", ["pytorch_lightning", "lightning.pytorch"])
@pytest.mark.parametrize("old, new, settings", [
    ("ssp", "ssp_delay", {"sync": "delay", "staleness": 3}),
    ("allreduce_asgd", "delayed_averaging", {"method": "dga", "compensation": None}),
    ("allreduce_asgd_dc", "delayed_averaging_dc", {"method": "pipe_sgd", "compensation": "dc"}),
])
def test_a_renamed_strategy_alias_builds_the_new_ones_strategy_and_warns(flavour, old, new, settings):
    import lightning_hybrid.lightning  # noqa: F401  (registers the aliases with lightning.pytorch too)

    trainer_class = importlib.import_module(flavour).Trainer
    with pytest.warns(FutureWarning, match=f"strategy='{old}' is now strategy='{new}'"):
        strategy = trainer_class(accelerator="cpu", devices=2, strategy=old, logger=False).strategy
    built = trainer_class(accelerator="cpu", devices=2, strategy=new, logger=False).strategy
    assert type(strategy) is type(built) and type(strategy).__module__.startswith(
        "lightning_hybrid.lightning" if flavour == "lightning.pytorch" else "lightning_hybrid.strategies")
    assert {name: getattr(strategy, name) for name in settings} == settings


def test_the_renamed_subcommand_still_writes_the_phantoms_and_warns(tmp_path):
    from lightning_hybrid.cli.data import data_command

    with pytest.warns(FutureWarning, match="lightning-hybrid data synth-adni is now lightning-hybrid data make-adni-phantoms"):
        data_command(["synth-adni", "--out", str(tmp_path), "--subjects", "4", "--shape", "8", "8", "8"])
    assert (tmp_path / "adni.csv").is_file()


def test_a_run_folder_recorded_under_a_renamed_class_resumes_under_the_new_name(tmp_path):
    import yaml

    from lightning_hybrid.run_folder import RECORD, ResumeRefused, checkpoint_to_resume

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last-interrupted.ckpt").write_bytes(b"x")
    recorded = {"strategy": {"_target_": "lightning_hybrid.AllReduceASGDStrategy", "delay": 2},
                "data": {"_target_": "lightning_hybrid.data.SyntheticADNIDataModule", "root": "adni"},
                "baseline": {"_target_": "lightning_hybrid.strategies.common.CheckedDDPStrategy"}}
    # as a run before the renames wrote it
    (tmp_path / RECORD).write_text(yaml.safe_dump({"status": "interrupted", "config": recorded}))
    now = {"strategy": {"_target_": "lightning_hybrid.DelayedAveragingStrategy", "delay": 2},
           "data": {"_target_": "lightning_hybrid.data.PhantomADNIDataModule", "root": "adni"},
           "baseline": {"_target_": "lightning_hybrid.strategies.checked_ddp.CheckedDDPStrategy"}}
    assert checkpoint_to_resume(tmp_path, now) == tmp_path / "checkpoints" / "last-interrupted.ckpt"
    with pytest.raises(ResumeRefused, match="strategy._target_: 'lightning_hybrid.DelayedAveragingStrategy' -> "
                                            "'lightning_hybrid.SSPStrategy'"):
        checkpoint_to_resume(tmp_path, {**now, "strategy": {"_target_": "lightning_hybrid.SSPStrategy", "delay": 2}})
