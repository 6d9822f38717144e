"""Transfer learning (ClinicaDL's transfer_path): a run starts from another run's weights, all of the
model's tensors or a refusal naming what does not fit; through the command line, single and pipelined."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

from conftest import run_cli
from lightning_hybrid import run_folder
from lightning_hybrid.transfer import load_transferred, read_state_dict, transfer_checkpoint


def small_net(classes: int = 2) -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, classes))


def test_every_tensor_of_the_model_is_copied_buffers_included():
    source, target = small_net(), small_net()
    source[1].running_mean.fill_(3.0)
    assert load_transferred(target, source.state_dict()) == len(target.state_dict())
    for (name, a), b in zip(source.state_dict().items(), target.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_stage_takes_its_part_of_a_larger_checkpoint():
    whole = small_net()
    stage = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))  # the first two blocks, the same names
    assert load_transferred(stage, whole.state_dict()) == 2 + 5
    assert torch.equal(stage[0].weight, whole[0].weight)
    with torch.device("meta"):  # a pipeline stage's model: the other stage's blocks on the meta device
        placed = small_net()
    placed[3].to_empty(device="cpu")
    assert load_transferred(placed, whole.state_dict()) == 2
    assert torch.equal(placed[3].weight, whole[3].weight) and placed[0].weight.is_meta


def test_another_shape_or_a_missing_tensor_is_refused_by_name():
    with pytest.raises(ValueError, match=r"3\.weight \(2, 8\) vs \(3, 8\).*number of classes"):
        load_transferred(small_net(classes=3), small_net(classes=2).state_dict())
    deeper = nn.Sequential(*small_net(), nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"2 tensors of the model are not in it \(4\.weight, 4\.bias\)"):
        load_transferred(deeper, small_net().state_dict())


def test_the_path_names_a_file_or_a_run_folder(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    newest, best = run / "checkpoints" / "epoch001.ckpt", run / "checkpoints" / "epoch000.ckpt"
    for age, path in enumerate((newest, best)):  # modification times set: two saves can share one
        torch.save({"state_dict": small_net().state_dict()}, path)
        os.utime(path, (1_000_000 - age * 100, 1_000_000 - age * 100))
    assert transfer_checkpoint(best) == best
    assert transfer_checkpoint(run) == newest  # no record: the newest
    run_folder.write_record(run, {"seed": 0}, "finished", best_checkpoint=str(best))
    assert transfer_checkpoint(run) == best  # the record's best
    assert set(read_state_dict(best)) == set(small_net().state_dict())
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        transfer_checkpoint(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        transfer_checkpoint(tmp_path / "empty")


SMOKE = ("experiment=smoke", "callbacks=[model_checkpoint]")


def test_a_run_starts_from_another_run_s_weights_through_the_command_line(tmp_path):
    """The source trains; the second run starts from its folder and trains at lr 0: the same weights, so
    the same test loss. A model of another shape is refused before training, naming the tensors."""
    source = tmp_path / "source"
    run_cli(*SMOKE, f"hydra.run.dir={source}", cwd=tmp_path)
    tested = json.loads((source / "metrics.json").read_text())
    target = tmp_path / "target"
    proc = run_cli(*SMOKE, f"hydra.run.dir={target}", f"transfer_path={source}", "optimizer.lr=0",
                   "optimizer.momentum=0", cwd=tmp_path)
    assert "started from" in proc.stdout + proc.stderr
    again = json.loads((target / "metrics.json").read_text())
    assert again["test/loss"] == pytest.approx(tested["test/loss"], rel=1e-5)
    assert again["test/acc"] == pytest.approx(tested["test/acc"])
    fresh = run_cli(*SMOKE, f"hydra.run.dir={tmp_path / 'fresh'}", "optimizer.lr=0", "optimizer.momentum=0",
                    cwd=tmp_path)
    assert json.loads((tmp_path / "fresh" / "metrics.json").read_text())["test/loss"] != pytest.approx(
        tested["test/loss"], rel=1e-3), "a run from a random initialisation must not match (the test above could not fail)"
    refused = run_cli(*SMOKE, f"hydra.run.dir={tmp_path / 'other'}", f"transfer_path={source}", "model=mlp",
                      cwd=tmp_path, check=False)
    assert refused.returncode != 0
    assert "cannot start from" in refused.stderr + refused.stdout and "not in it" in refused.stderr + refused.stdout
