"""The ADNI-like benchmark cohort: real anatomy (Colin27, AAL) with atrophy, written as ClinicaDL's outputs."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from conftest import shared_folder
from lightning_hybrid.data import ADNIDataModule
from lightning_hybrid.data.adni_like import (
    BRAIN_SUFFIX, MASK_SUFFIX, MRICRON_TEMPLATES, CohortSettings, TemplateNotFoundError, _sample, outward_field, write_cohort,
)
from lightning_hybrid.data.clinicadl import CROPPED_SHAPE, t1_linear_affine, t1_linear_image

needs_templates = pytest.mark.skipif(
    not (MRICRON_TEMPLATES / "ch2.nii.gz").is_file(),
    reason=f"Colin27 and AAL are not in {MRICRON_TEMPLATES}: apt-get install mricron-data (.ci/run installs it)",
)


def test_the_atrophy_field_shrinks_a_region_and_its_opposite_grows_it():
    grid = np.stack(np.meshgrid(*[np.arange(40)] * 3, indexing="ij"), -1)
    ball = ((grid - 20) ** 2).sum(-1) <= 8**2
    field = torch.from_numpy(outward_field(ball))[None]
    points = torch.from_numpy(grid.astype(np.float32))
    volume = torch.from_numpy(ball.astype(np.float32))[None, None]
    shrunk = _sample(volume, points + 1.5 * _sample(field, points).permute(1, 2, 3, 0))[0] > 0.5
    grown = _sample(volume, points - 1.5 * _sample(field, points).permute(1, 2, 3, 0))[0] > 0.5
    radius = lambda mask: (3 * mask.sum().item() / (4 * np.pi)) ** (1 / 3)  # noqa: E731
    assert radius(shrunk) == pytest.approx(radius(ball) - 1.5, abs=0.5)
    assert radius(grown) == pytest.approx(radius(ball) + 1.5, abs=0.5)


def test_a_missing_template_says_how_to_get_it(tmp_path):
    with pytest.raises(TemplateNotFoundError, match="apt-get install mricron-data"):
        write_cohort(tmp_path / "out", templates=tmp_path)


@pytest.fixture(scope="module")
def cohort(tmp_path_factory) -> Path:
    if not (MRICRON_TEMPLATES / "ch2.nii.gz").is_file():
        pytest.skip(f"Colin27 and AAL are not in {MRICRON_TEMPLATES}: apt-get install mricron-data (.ci/run installs it)")
    # 5 subjects, 6 sessions (seed 3: one follow-up), each a whole brain to render: the fewest with both
    # diagnoses in the test set and a subject in each of the 2 folds' training and validation sets
    settings = replace(CohortSettings(subjects={"AD": 3, "CN": 2}, seed=3, followup_fraction=0.5, test_fraction=0.34,
                                      n_splits=2), severity={"AD": (1.0, 0.05), "CN": (0.0, 0.05)})
    return shared_folder(tmp_path_factory, "adni_like_cohort", lambda out: write_cohort(out, settings, workers=2))


def rows(path: Path) -> list[dict]:
    return list(csv.DictReader(open(path), delimiter="\t"))


@needs_templates
def test_the_cohort_is_where_clinicadl_puts_it(cohort):
    labels = rows(cohort / "labels.tsv")
    assert {r["diagnosis"] for r in labels} == {"AD", "CN"} and len({r["participant_id"] for r in labels}) == 5
    assert any(r["session_id"] == "ses-M012" for r in labels)
    for name in ("train.tsv", "train_baseline.tsv", "test_baseline.tsv", "2_fold/split-0/train.tsv",
                 "2_fold/split-1/validation_baseline.tsv"):
        assert rows(cohort / "split" / name), name
    for row in labels:
        image = t1_linear_image(cohort / "caps", row["participant_id"], row["session_id"])
        assert image.name == f"{row['participant_id']}_{row['session_id']}_space-MNI152NLin2009cSym_desc-Crop_res-1x1x1_T1w.nii.gz"
        loaded = nib.load(image)
        assert loaded.shape == CROPPED_SHAPE == (169, 208, 179) and np.allclose(loaded.affine, t1_linear_affine())
        base = str(image).removesuffix("space-MNI152NLin2009cSym_desc-Crop_res-1x1x1_T1w.nii.gz")
        mask, brain = (np.asarray(nib.load(base + suffix).dataobj) > 0 for suffix in (MASK_SUFFIX, BRAIN_SUFFIX))
        assert 2e4 < mask.sum() < 2e5 and 1.2e6 < brain.sum() < 2.2e6  # cm^3: tens of the atrophy region, ~1.7 l of brain
        assert (mask & brain).sum() > 0.9 * mask.sum()


@needs_templates
def test_ad_shrinks_the_hippocampi_and_enlarges_the_ventricles_as_in_the_literature(cohort):
    truth = rows(cohort / "truth.tsv")
    mean = lambda d, k: np.mean([float(r[k]) for r in truth if r["diagnosis"] == d and r["session_id"] == "ses-M000"])  # noqa: E731
    hippocampus = mean("AD", "hippocampus_mm3") / mean("CN", "hippocampus_mm3")
    ventricles = mean("AD", "ventricles_mm3") / mean("CN", "ventricles_mm3")
    assert 0.65 < hippocampus < 0.9, hippocampus  # AD: about 20-25 % less hippocampus than controls
    assert 1.2 < ventricles < 1.9, ventricles  # and 30-60 % larger ventricles


@needs_templates
def test_the_cohort_trains_through_the_datamodule_without_leakage(cohort):
    dm = ADNIDataModule({"caps_directory": cohort / "caps", "tsv_path": cohort / "split"}, split={"fold": 0},
                        view={"image_shape": (40, 48, 40), "spacing": (4.0, 4.0, 4.0)}, augment={"where": None},
                        cache={"where": None}, batch_size=2, num_workers=0)
    dm.setup()
    assert {s.label for s in dm.splits["test"]} == {0, 1}
    image, label, key = dm.test_set[0]
    assert image.shape == (1, 40, 48, 40) and torch.isfinite(image).all() and image.std() > 0.5


@needs_templates
@pytest.mark.parametrize("config", ["adni", "adni_like"])
def test_the_default_view_holds_the_whole_brain(cohort, config):
    """The centred view of data=adni (1.5 mm) and data=adni_like (2 mm) spans every brain voxel of a subject."""
    from omegaconf import OmegaConf

    data = OmegaConf.load(Path(__file__).resolve().parents[2] / "configs" / "data" / f"{config}.yaml")
    base = OmegaConf.load(Path(__file__).resolve().parents[2] / "configs" / "data" / "adni.yaml")
    view = OmegaConf.merge(base.view, data.get("view", {}))
    shape, spacing = np.array(view.image_shape), np.array(view.spacing)
    for path in sorted((cohort / "caps").rglob(f"*{BRAIN_SUFFIX}")):
        brain = nib.load(path)
        voxels = np.argwhere(np.asarray(brain.dataobj) > 0)
        world = nib.affines.apply_affine(brain.affine, voxels)
        corners = nib.affines.apply_affine(brain.affine, np.array([[0, 0, 0], np.array(brain.shape) - 1]))
        centre = corners.mean(0)
        half = shape * spacing / 2 - spacing  # a voxel's margin for where the crop's rounding puts the centre
        assert (world.min(0) >= centre - half).all() and (world.max(0) <= centre + half).all(), (
            f"{config}: brain spans {world.min(0)}..{world.max(0)} mm, the view {centre - half}..{centre + half}")


@needs_templates
def test_mci_atrophy_is_milder_and_partly_present(cohort):
    """At one severity, a pMCI or sMCI subject's hippocampi shrink as an AD subject's do, its ventricles grow half as
    much (the atrophy partly present); labelled as ClinicaDL labels them, pMCI being the disease (class 0)."""
    from lightning_hybrid.data.adni_like import Session, _Template, load_colin27, render

    settings = CohortSettings(subjects={"pMCI": 1, "sMCI": 1}, seed=1)
    template = _Template(load_colin27(), settings)
    volumes = {dx: render(template, Session("sub-ADNI002S0001", "ses-M000", dx, severity, 7, 8, 70.0, "F"))[3]
               for dx, severity in (("CN", 0.0), ("AD", 1.0), ("pMCI", 1.0))}
    growth = {dx: volumes[dx]["ventricles_mm3"] - volumes["CN"]["ventricles_mm3"] for dx in ("AD", "pMCI")}
    loss = {dx: volumes["CN"]["hippocampus_mm3"] - volumes[dx]["hippocampus_mm3"] for dx in ("AD", "pMCI")}
    assert growth["pMCI"] == pytest.approx(growth["AD"] / 2, rel=0.15) and growth["AD"] > 0
    assert loss["pMCI"] == pytest.approx(loss["AD"], rel=0.02) and loss["AD"] > 0
    dm = ADNIDataModule({"caps_directory": cohort / "caps", "tsv_path": cohort / "split"}, task="pMCI_vs_sMCI",
                        split={"fold": 0})
    assert dm.labels == ["pMCI", "sMCI"] and dm.positive_class == 0
