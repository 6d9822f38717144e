"""Names users typed before issue 63 keep working for a release, each warning with its new name
(:mod:`lightning_hybrid.deprecation`): classes, functions, a module cut in parts, a config option, a subcommand."""

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
])
def test_an_old_name_warns_with_the_new_one_and_gives_its_object(module, old, new_module, new):
    with pytest.warns(FutureWarning, match=rf"{module}\.{old} is now {new_module}\.{new}; the old name goes"):
        value = getattr(importlib.import_module(module), old)
    assert value is getattr(importlib.import_module(new_module), new)
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
        getattr(importlib.import_module(module), "NoSuchName")


def test_a_renamed_config_option_composes_as_the_new_one_and_the_command_warns(tmp_path):
    old = compose_run(tmp_path, "data=adni_synthetic")
    choices = dict(HydraConfig.get().runtime.choices)
    new = compose_run(tmp_path, "data=adni_phantoms")
    assert old.data == new.data and new.data._target_.endswith("PhantomADNIDataModule")
    assert RENAMED_OPTIONS["data"] == {"adni_synthetic": "adni_phantoms"}
    with pytest.warns(FutureWarning, match="data=adni_synthetic is now data=adni_phantoms"):
        warn_renamed_options(choices)


def test_the_renamed_subcommand_still_writes_the_phantoms_and_warns(tmp_path):
    from lightning_hybrid.cli.data import data_command

    with pytest.warns(FutureWarning, match="lightning-hybrid data synth-adni is now lightning-hybrid data make-adni-phantoms"):
        data_command(["synth-adni", "--out", str(tmp_path), "--subjects", "4", "--shape", "8", "8", "8"])
    assert (tmp_path / "adni.csv").is_file()
