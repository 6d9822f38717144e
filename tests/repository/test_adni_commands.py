"""Every ADNI training command in the README, the docs and the recipes trains at its settings: the training
loss falls and nothing is NaN. Each runs at a small size (synthetic volumes, 8 base channels, a few epochs);
what the command sets (optimizer, learning rate, strategy, model, task) is kept. A GPU command runs on
the CPU where there is no GPU, in fp32: torch 2.13's CPU (oneDNN) bf16 Conv3d weight gradients are wrong
on small feature maps (2 x 2 x 2: 1e35 where fp32 gives 17), which is torch's bug, not the command's."""

from __future__ import annotations

import csv
import math
import shlex
from pathlib import Path

import pytest
import torch

from conftest import run_cli
from doc_commands import is_adni, training_commands

#: Where a command's data lives and how it is split (replaced by small synthetic volumes): ClinicaDL's keys and the CSV's.
DATA_SOURCE_GROUPS = ("data.source.", "data.split.")


def adni_commands() -> list[tuple[str, str]]:
    """(page:line, command) of every `lightning-hybrid` training command on ADNI data or a 3D-ResAttNet."""
    return [(where, command) for where, command in training_commands() if is_adni(command)]


def at_small_size(command: str, tmp_path: Path) -> list[str]:
    """The command's overrides with its data made small and synthetic, its devices made two at most."""
    overrides = []
    for token in shlex.split(command):
        if token in ("-m", "..."):
            continue
        key, _, value = token.partition("=")
        if key == "data" or key.startswith(DATA_SOURCE_GROUPS) or key.startswith("hydra"):
            continue  # the data becomes small synthetic volumes below
        if key == "transfer_path":
            continue  # a run of the reader's (tests/test_transfer.py starts from one)
        if key == "trainer" and value == "gpu" and not torch.cuda.is_available():
            value = "cpu"
        if key == "trainer.precision" and not torch.cuda.is_available():
            value = "32-true"
        if key == "trainer.devices" and int(value) > 2:
            continue
        if key == "strategy.data_parallel":
            value = "1"
        overrides.append(f"{key}={value.split(',')[0]}")  # a sweep's first job
    stages = next((o.split("=")[1] for o in overrides if o.startswith("strategy.pipeline_stages=")), None)
    if stages and not any(o.startswith("trainer.devices=") for o in overrides):
        overrides.append(f"trainer.devices={stages}")
    return [*overrides, "data=adni_phantoms", f"data.root={tmp_path / 'synth'}", "data.subjects=24",
            "data.volume_shape=[40,48,40]", "data.view.image_shape=[40,40,40]", "data.cache.dir=null",
            "model.base_channels=8", "trainer.max_epochs=4", "logger=csv", "callbacks=[model_checkpoint]", "allow_cpu_oversubscription=true",
            f"hydra.run.dir={tmp_path / 'run'}"]


def test_the_docs_have_adni_commands_to_check():
    commands = [c for _, c in adni_commands()]
    assert any("experiment=akintoye2022_hybrid_adni" in c for c in commands), commands
    assert any("data=adni_like" in c or "data=adni_caps" in c for c in commands), commands


@pytest.mark.multiprocess
@pytest.mark.parametrize("where, command", adni_commands(), ids=[w for w, _ in adni_commands()])
def test_the_adni_command_trains_at_its_settings(where, command, tmp_path):
    run_cli(*at_small_size(command, tmp_path), cwd=tmp_path, timeout=400)
    (metrics,) = (tmp_path / "run").glob("csv/*/metrics.csv")
    losses = [float(r["train/loss_epoch"]) for r in csv.DictReader(open(metrics)) if r.get("train/loss_epoch")]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses), f"{where}: {command}: {losses}"
    assert losses[-1] < losses[0], f"{where}: {command}: the training loss did not fall: {losses}"
