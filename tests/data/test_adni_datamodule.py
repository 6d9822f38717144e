"""ADNIDataModule on small synthetic volumes: splits, preprocessing, bad input, learning, DDP."""

from __future__ import annotations

import csv
import logging
from functools import partial
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from conftest import run_cli
from lightning_hybrid import ClassifierModule
from lightning_hybrid.data import ADNIDataModule, BadItemError
from lightning_hybrid.data.adni_phantoms import write_adni_phantoms
from lightning_hybrid.models import ResAttNet3D

SMALL = dict(view={"image_shape": (32, 32, 32)}, cache={"where": None}, augment={"where": None}, batch_size=4, num_workers=0)


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> Path:
    return write_adni_phantoms(tmp_path_factory.mktemp("synth"), subjects=24, shape=(40, 44, 40), seed=3, extra_scan_prob=0.5)


def test_shapes_dtypes_and_subject_splits(synth):
    dm = ADNIDataModule({"csv_path": synth}, split={"val_fraction": 0.2, "test_fraction": 0.2}, **SMALL)
    dm.setup()
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 1, 32, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert set(y.tolist()) <= {0, 1}
    subjects = {name: {s.subject for s in scans} for name, scans in dm.splits.items()}
    assert not subjects["train"] & subjects["val"] and not subjects["train"] & subjects["test"]
    assert not subjects["val"] & subjects["test"], "a subject's scans never fall in two splits"
    for scans in dm.splits.values():  # 6 AD and 6 NC subjects: stratified, both classes everywhere
        assert {s.label for s in scans} == {0, 1}
    assert sum(len(v) for v in subjects.values()) == 12


def test_kfold_covers_every_subject_once(synth):
    tests = []
    for fold in range(3):
        dm = ADNIDataModule({"csv_path": synth}, split={"folds": 3, "fold": fold, "val_fraction": 0.2}, **SMALL)
        dm.setup()
        tests.append({s.subject for s in dm.splits["test"]})
    assert sum(len(t) for t in tests) == len(set().union(*tests)) == 12


def test_pmci_task_and_spellings(tmp_path, synth):
    rows = list(csv.DictReader(open(synth)))
    spelled = tmp_path / "spelled.csv"
    with open(spelled, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["PTID", "Image Path", "DX_bl"])
        for r in rows:
            writer.writerow([r["subject_id"], str(synth.parent / r["image"]), {"NC": "CN"}.get(r["diagnosis"], r["diagnosis"])])
    dm = ADNIDataModule({"csv_path": spelled}, task="pMCI_vs_sMCI", split={"val_fraction": 0.2, "test_fraction": 0.2},
                        **SMALL)
    dm.setup()
    assert sum(len(v) for v in dm.splits.values()) == sum(r["diagnosis"] in ("sMCI", "pMCI") for r in rows)


def bad_csv(tmp_path: Path, synth: Path, case: str) -> tuple[Path, str]:
    rows = list(csv.DictReader(open(synth)))
    good = synth.parent / rows[0]["image"]
    bad = tmp_path / f"{case}.nii"
    expected = str(bad)
    if case == "corrupt":
        bad.write_bytes(b"not a nifti file at all" * 20)
    elif case == "truncated":
        nib.save(nib.load(good), bad)
        bad.write_bytes(bad.read_bytes()[:-5000])
    elif case == "2d":
        nib.save(nib.Nifti1Image(np.zeros((16, 16), np.float32), np.eye(4)), bad)
    elif case == "4d":
        nib.save(nib.Nifti1Image(np.zeros((8, 8, 8, 2), np.float32), np.eye(4)), bad)
    elif case == "missing":
        bad = tmp_path / "nowhere.nii.gz"
        expected = str(bad)
    diagnosis = "Martian" if case == "diagnosis" else "AD"
    if case == "diagnosis":
        bad, expected = good, "unknown diagnosis 'Martian'"
    path = tmp_path / f"{case}.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["subject_id", "image", "diagnosis"])
        for r in rows:
            writer.writerow([r["subject_id"], str(synth.parent / r["image"]), r["diagnosis"]])
        writer.writerow(["999_S_9999", str(bad), diagnosis])
    return path, expected


@pytest.mark.parametrize("case", ["corrupt", "truncated", "2d", "4d", "missing", "diagnosis"])
def test_bad_items_error_or_skip(tmp_path, synth, case, caplog):
    path, expected = bad_csv(tmp_path, synth, case)
    with pytest.raises(BadItemError, match=expected.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        ADNIDataModule({"csv_path": path}, **SMALL).setup()
    dm = ADNIDataModule({"csv_path": path, "on_bad_file": "skip"}, **SMALL)
    with caplog.at_level(logging.WARNING):
        dm.setup()
    assert len(dm.skipped) == 1 and "skipped 1 bad item" in caplog.text
    assert sum(len(v) for v in dm.splits.values()) > 0


def test_missing_column(tmp_path):
    path = tmp_path / "cols.csv"
    path.write_text("subject_id,image\nA,a.nii.gz\n")
    with pytest.raises(BadItemError, match="no 'diagnosis' column"):
        ADNIDataModule({"csv_path": path}, **SMALL).setup()


def test_bad_settings(synth):
    with pytest.raises(ValueError, match="unknown task"):
        ADNIDataModule({"csv_path": synth}, task="AD_vs_cats")
    with pytest.raises(ValueError, match="divisible by view.downsample"):
        ADNIDataModule({"csv_path": synth}, view={"image_shape": (33, 32, 32), "downsample": 2})
    with pytest.raises(FileNotFoundError, match="make-adni-like"):
        ADNIDataModule({"csv_path": synth.parent / "missing.csv"})


def test_training_beats_chance_on_held_out_subjects(tmp_path):
    csv_path = write_adni_phantoms(tmp_path, subjects=64, shape=(40, 44, 40), seed=7, diagnoses=("AD", "NC"))
    pl.seed_everything(0)
    dm = ADNIDataModule({"csv_path": csv_path}, split={"val_fraction": 0.15, "test_fraction": 0.2},
                        view={"image_shape": (32, 32, 32)}, augment={"where": "device"}, cache={"where": "memory"},
                        batch_size=8, num_workers=0)
    module = ClassifierModule(ResAttNet3D(depth=18, base_channels=8), optimizer=partial(torch.optim.Adam, lr=3e-4))
    trainer = pl.Trainer(accelerator="cpu", max_epochs=15, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=dm)
    (result,) = trainer.test(module, datamodule=dm, verbose=False)
    assert len(dm.splits["test"]) >= 12
    assert result["test/acc"] > 0.75, result  # chance is 0.5


@pytest.mark.multiprocess
def test_two_process_ddp_with_the_model(tmp_path):
    run_dir = tmp_path / "run"
    run_cli(
        "data=adni_phantoms", f"data.root={tmp_path / 'synth'}", "data.subjects=16", "data.volume_shape=[24,24,24]",
        "data.view.image_shape=[16,16,16]", "data.batch_size=2", "model=resattnet3d_18", "model.base_channels=4",
        "strategy=ddp", "trainer.devices=2", "trainer=debug", "allow_cpu_oversubscription=true",
        f"hydra.run.dir={run_dir}", cwd=tmp_path,
    )
    assert (run_dir / "metrics.json").is_file() and (run_dir / "train_ddp_process_1.log").is_file()


def test_disk_cache_decodes_each_volume_once(synth, tmp_path):
    cache_dir = tmp_path / "cache"
    dm = ADNIDataModule({"csv_path": synth}, view={"image_shape": (32, 32, 32)}, augment={"where": None},
                        cache={"where": "disk", "dir": cache_dir}, batch_size=4)
    dm.setup()
    first = [x.clone() for x, _ in dm.train_dataloader()]
    for index in range(len(dm.train_set)):  # the loader drops the last incomplete batch
        dm.train_set[index]
    assert len(list(cache_dir.glob("*.pt"))) == len(dm.splits["train"])  # one preprocessed file per training scan
    dm2 = ADNIDataModule({"csv_path": synth}, view={"image_shape": (32, 32, 32)}, augment={"where": None},
                         cache={"where": "disk", "dir": cache_dir}, batch_size=4)
    dm2.setup()
    again = [x for x, _ in dm2.train_dataloader()]
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_memory_cache_persists_between_runs_in_cache_dir(synth, tmp_path, monkeypatch):
    settings = dict(view={"image_shape": (32, 32, 32)}, augment={"where": None}, cache={"where": "memory", "dir": tmp_path / "c"},
                    batch_size=4, num_workers=0)
    dm = ADNIDataModule({"csv_path": synth}, **settings)
    dm.setup()
    assert len(list((tmp_path / "c").glob("*.pt"))) == sum(len(v) for v in dm.splits.values())
    first = torch.stack([x for x, _ in dm.train_set])
    from lightning_hybrid.data.volume_files import LoadVolumed

    def no_decoding(self, data):
        raise AssertionError("a cached volume was decoded again")

    monkeypatch.setattr(LoadVolumed, "__call__", no_decoding)
    again = ADNIDataModule({"csv_path": synth}, **settings)
    again.setup()  # every volume read from the disk cache
    assert torch.equal(torch.stack([x for x, _ in again.train_set]), first)
    changed = ADNIDataModule({"csv_path": synth}, **{**settings, "view": {"image_shape": (24, 24, 24)}})
    with pytest.raises(RuntimeError) as raised:  # other preprocessing settings: other cache entries
        changed.setup()
    assert "decoded again" in str(raised.value.__cause__)


def test_loader_settings_feed_an_accelerator(synth):
    dm = ADNIDataModule({"csv_path": synth}, view={"image_shape": (32, 32, 32)}, cache={"where": None}, batch_size=4)
    dm.setup()
    loader = dm.train_dataloader()
    assert loader.num_workers == 2 and loader.persistent_workers and loader.prefetch_factor == 4
    assert loader.pin_memory == torch.cuda.is_available()
    assert ADNIDataModule({"csv_path": synth}, augment={"where": "workers"},
                          cache={"where": None}).loader_workers >= 1
    with pytest.raises(ValueError, match="augment.where"):
        ADNIDataModule({"csv_path": synth}, augment={"where": "gpu"})


class _OnDevice:
    """What the datamodule reads of a trainer to place its cache: the strategy's root device."""

    def __init__(self, device: str) -> None:
        self.strategy = type("Strategy", (), {"root_device": torch.device(device)})()


def test_device_cache_serves_the_batches_of_the_memory_cache_from_the_device(synth):
    """``cache="device"``: the volumes stacked once on the training device, the same batches in the same
    order, no loader workers; ``"auto"`` stays in host memory off CUDA; workers cannot augment there."""
    batches = {}
    for cache in ("memory", "device", "auto"):
        dm = ADNIDataModule({"csv_path": synth}, **{**SMALL, "cache": {"where": cache}, "num_workers": 2})
        dm.setup()
        dm.trainer = _OnDevice("cpu")
        loaders = [dm.train_dataloader(), dm.val_dataloader()]
        assert (dm.device_cache == torch.device("cpu")) == (cache == "device"), cache
        if cache == "device":
            assert all(loader.num_workers == 0 and not loader.pin_memory for loader in loaders)
            assert dm.train_dataloader().dataset is loaders[0].dataset  # stacked once
        batches[cache] = [[t.clone() for t in batch] for loader in loaders for batch in loader]
    for got in (batches["device"], batches["auto"]):
        assert len(got) == len(batches["memory"])
        for a, b in zip(got, batches["memory"]):
            assert all(torch.equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="augment.where=device"):
        ADNIDataModule({"csv_path": synth}, augment={"where": "workers"}, cache={"where": "device"})
    with pytest.raises(ValueError, match="cache.where must be one of"):
        ADNIDataModule({"csv_path": synth}, cache={"where": "gpu"})


class _Training:
    training, global_rank = True, 0


def test_augmentation_runs_on_the_transferred_training_batch(synth):
    dm = ADNIDataModule({"csv_path": synth}, **{**SMALL, "augment": {"where": "device"}})
    dm.setup()
    x, y = next(iter(dm.train_dataloader()))
    assert torch.equal(dm.on_after_batch_transfer((x, y), 0)[0], x)  # no trainer, or not training: untouched
    dm.trainer = _Training()
    augmented, labels = dm.on_after_batch_transfer((x, y), 0)
    assert augmented.shape == x.shape and labels is y and not torch.equal(augmented, x)
    loader_items = [dm.train_set[i][0] for i in range(3)]  # the workers hand out preprocessed volumes as they are
    assert all(torch.equal(a, b) for a, b in zip(loader_items, [dm.train_set[i][0] for i in range(3)]))


def test_a_split_asked_for_but_empty_is_refused_with_the_cohorts_numbers(synth):
    """24 synthetic subjects hold 6 AD and 6 NC: a test fraction of 0.05 rounds to 0 subjects per class."""
    dm = ADNIDataModule({"csv_path": synth}, split={"val_fraction": 0.2, "test_fraction": 0.05}, **SMALL)
    with pytest.raises(ValueError, match=r"the test split is empty.*12 subjects \(6 AD, 6 CN;.*data.split.test_fraction=0.05"):
        dm.setup()
    dm = ADNIDataModule({"csv_path": synth}, split={"val_fraction": 0.2, "test_fraction": 0.0}, **SMALL)
    dm.setup()  # asked for none: no test set, no error
    assert not dm.splits["test"] and dm.splits["val"]
