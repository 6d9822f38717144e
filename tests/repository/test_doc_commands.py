"""Every training command the README, the docs and the recipes show (other than ADNI's, which
tests/repository/test_adni_commands.py runs) trains, at a small size: one epoch of three batches, on tiny data of
the kind the command reads (MNIST files, shards packed from them, or the synthetic set), everything else
as the command sets it. A GPU command runs on the CPU where there is no GPU. Commands that need what a
test cannot have (a SLURM cluster, a checkpoint the reader names) are listed and skipped, saying why;
every alias also runs as users type it in tests/cli/test_commands.py."""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module

from command_aliases import ALIASES
from conftest import run_cli, write_tiny_mnist
from doc_commands import is_adni, training_commands

pytestmark = pytest.mark.multiprocess

#: Why a shown command cannot run here, by a piece of it.
CANNOT = {
    "hydra/launcher=slurm ": "submits to a SLURM cluster (hydra/launcher=slurm_local is tested in test_slurm_launcher.py)",
    "hydra/launcher=slurm_local": "a sweep through submitit's local executor, tested in test_slurm_launcher.py",
    "<run>": "resumes a checkpoint the reader names",
    "PATH": "tests a checkpoint the reader names (test_cli.py tests partitioned inference of a trained one)",
    "...": "an elided command",
}
SMALL = ("trainer.max_epochs=1", "trainer.limit_train_batches=3", "trainer.limit_val_batches=1",
         "trainer.limit_test_batches=1", "trainer.num_sanity_val_steps=0", "trainer.enable_progress_bar=false",
         "watchdog_s=120")


def commands() -> list[tuple[str, str]]:
    """The commands to run, each setting once (the same overrides shown on two pages run once)."""
    seen, found = set(), []
    for where, command in training_commands():
        key = tuple(sorted(as_overrides(command)))
        if not is_adni(command) and key not in seen:
            seen.add(key)
            found.append((where, command))
    return found


def as_overrides(command: str) -> list[str]:
    """The command's overrides: a sweep's first job, the CPU where there is no GPU."""
    overrides = []
    for token in shlex.split(command):
        if token == "-m":
            continue
        key, _, value = token.partition("=")
        if key == "trainer" and value == "gpu" and not torch.cuda.is_available():
            value = "cpu"
        if key == "data.root":
            continue  # the data are made below
        overrides.append(f"{key}={value.split(',')[0] if ',' in value and '[' not in value else value}")
    return overrides


def tiny_data(overrides: list[str], folder: Path) -> list[str]:
    """Overrides that give the command's datamodule tiny data of its kind (the config composed to see which)."""
    with initialize_config_module("lightning_hybrid.configs", version_base=None):
        cfg = compose("train", overrides=overrides)
    target = cfg.data._target_
    if target.endswith("MNISTDataModule") and "Synthetic" not in target:
        write_tiny_mnist(folder / "mnist", n_train=400, n_test=100)
        return [f"data.root={folder / 'mnist'}", "data.verify_md5=false", "data.download=false"]
    if target.endswith("ShardDataModule"):
        from lightning_hybrid.data.shards import pack

        rng = np.random.default_rng(0)
        for split, n in (("train", 400), ("test", 100)):
            pack(rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), (np.arange(n) % 10).astype(np.int64),
                 str(folder / "mnist_shards" / split), shard_size=100)
        return [f"paths.data_dir={folder}"]
    return []


@pytest.mark.parametrize("where, command", commands(), ids=[w for w, _ in commands()])
def test_the_command_trains(where, command, tmp_path):
    reason = next((why for piece, why in CANNOT.items() if piece in command + " "), None)
    if reason:
        pytest.skip(f"{where}: {command}: {reason}")
    overrides = as_overrides(command)
    alias = next((o.split("=", 1)[1] for o in overrides if o.startswith("strategy=")), None)
    if sorted(overrides) == sorted([f"strategy={alias}", "trainer.devices=2"]) and alias in ALIASES:
        pytest.skip(f"{where}: {command}: run exactly so, as users type it, in test_commands.py")
    proc = run_cli(*overrides, *tiny_data(overrides, tmp_path / "data"), *SMALL,
                   "allow_cpu_oversubscription=true", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=300)
    assert "final metrics" in proc.stdout + proc.stderr, f"{where}: {command}"
