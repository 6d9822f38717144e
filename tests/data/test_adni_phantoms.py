"""The synthetic ADNI generator: files that round-trip through nibabel, a CSV, a class signal."""

from __future__ import annotations

import csv

import nibabel as nib
import numpy as np
import pytest

from conftest import Zygote, clean_env

from lightning_hybrid.data.adni_phantoms import synthetic_volume, write_adni_phantoms


def test_files_round_trip_through_nibabel(tmp_path):
    csv_path = write_adni_phantoms(tmp_path, subjects=8, shape=(32, 36, 32), seed=1, extra_scan_prob=0.5)
    rows = list(csv.DictReader(open(csv_path)))
    assert {"subject_id", "image", "diagnosis", "visit"} <= set(rows[0])
    assert len({r["subject_id"] for r in rows}) == 8 and len(rows) > 8  # some subjects have two scans
    assert {r["diagnosis"] for r in rows} == {"AD", "NC", "sMCI", "pMCI"}
    for row in rows:
        image = nib.load(tmp_path / row["image"])
        assert image.shape == (32, 36, 32)
        assert np.allclose(image.header.get_zooms(), (1.2, 1.0, 1.0))
        assert nib.aff2axcodes(image.affine) == ("L", "P", "S")  # not canonical: loaders must reorient
        data = image.get_fdata(dtype=np.float32)
        assert data.dtype == np.float32 and data.max() > 500


def test_ad_has_larger_ventricles_than_nc():
    def csf_voxels(diagnosis, seed):
        volume = synthetic_volume((48, 56, 48), diagnosis, np.random.default_rng(seed))
        inner = np.zeros_like(volume, dtype=bool)
        inner[12:36, 14:42, 12:36] = True  # the brain's centre: dark voxels there are ventricles
        return int(((volume < 200) & inner).sum())

    ad = [csf_voxels("AD", s) for s in range(4)]
    nc = [csf_voxels("NC", s) for s in range(4)]
    assert min(ad) > 1.5 * max(nc)


def test_cli_subcommand(tmp_path):
    proc = Zygote.run(
        ["-m", "lightning_hybrid.cli", "data", "make-adni-phantoms", "--out", str(tmp_path), "--subjects", "2", "--shape", "24",
         "28", "24"], clean_env(), tmp_path, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "adni.csv").is_file() and len(list((tmp_path / "images").iterdir())) >= 2


def test_bad_subject_count(tmp_path):
    with pytest.raises(ValueError, match="subjects must be positive"):
        write_adni_phantoms(tmp_path, subjects=0)
