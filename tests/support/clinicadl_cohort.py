"""A ClinicaDL cohort written by hand, not by our generator: a CAPS folder with both Clinica file-name
generations, 2- and 3-digit sessions and ``.pt`` tensors, TSVs spelling ADNI's subjects three ways,
and the split folders of ``clinicadl tsvtools split`` and ``kfold --n_splits 2``."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import torch

from lightning_hybrid.data.clinicadl import session_id, subject_key, t1_linear_affine

#: (site, RID, diagnosis, sessions); the TSVs spell each subject one of three ways.
SUBJECTS = [
    (2, 295, "AD", ["ses-M00", "ses-M12"]), (11, 21, "CN", ["ses-M00"]), (22, 1004, "AD", ["ses-M00"]),
    (41, 4200, "CN", ["ses-M00", "ses-M24"]), (5, 77, "AD", ["ses-M00"]), (67, 6001, "CN", ["ses-M00"]),
    (100, 9, "AD", ["ses-M00"]), (130, 130, "CN", ["ses-M00"]),
]
COLUMNS = ["participant_id", "session_id", "age", "sex", "diagnosis"]


def bids(site: int, rid: int) -> str:
    return f"sub-ADNI{site:03d}S{rid:04d}"


def spelled(number: int, site: int, rid: int) -> str:
    """PTID, BIDS and RID in turn: what different TSVs of one project write."""
    return (f"{site:03d}_S_{rid:04d}", bids(site, rid), str(rid))[number % 3]


def volume(seed: int, shape=(20, 24, 20)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij"))
    head = (grid**2).sum(0) < 0.8
    return (head * rng.uniform(400, 600) + rng.normal(0, 20, shape)).astype(np.float32)


def write_tsv(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["\t".join(COLUMNS)] + ["\t".join(str(r.get(c, "")) for c in COLUMNS) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def make_cohort(root: Path) -> dict:
    """A CAPS folder (older and newer Clinica names, 2- and 3-digit sessions, one .pt-only session, one
    with both) and the TSVs of ``tsvtools split`` + ``kfold --n_splits 2``; returns its rows."""
    caps = root / "caps"
    rows = []
    for number, (site, rid, diagnosis, sessions) in enumerate(SUBJECTS):
        for s, session in enumerate(sessions):
            new = number % 2 == 0  # Clinica >= 0.7.4: three-digit sessions, no _T1w before space
            folder_session = session_id(session) if new else session
            name = (f"{bids(site, rid)}_{folder_session}_" + ("" if new else "T1w_")
                    + "space-MNI152NLin2009cSym_desc-Crop_res-1x1x1_T1w.nii.gz")
            folder = caps / "subjects" / bids(site, rid) / folder_session
            image = nib.Nifti1Image(volume(number * 10 + s), t1_linear_affine())
            if (number, s) == (2, 0):  # prepare-data's tensor only
                tensors = folder / "deeplearning_prepare_data" / "image_based" / "t1_linear"
                tensors.mkdir(parents=True)
                torch.save(torch.from_numpy(volume(number * 10 + s))[None], tensors / name.replace(".nii.gz", ".pt"))
            else:
                (folder / "t1_linear").mkdir(parents=True)
                nib.save(image, folder / "t1_linear" / name)
            if (number, s) == (4, 0):  # both: the tensor is read, the NIfTI gives its affine
                tensors = folder / "deeplearning_prepare_data" / "image_based" / "t1_linear"
                tensors.mkdir(parents=True)
                torch.save(torch.from_numpy(volume(number * 10 + s))[None], tensors / name.replace(".nii.gz", ".pt"))
            rows.append({"participant_id": spelled(number + s, site, rid), "session_id": session,
                         "age": 70 + number, "sex": "MF"[number % 2], "diagnosis": "NC" if diagnosis == "CN" else diagnosis})
    split = root / "split"
    test = {bids(2, 295), bids(11, 21)}
    folds = [{bids(22, 1004), bids(41, 4200)}, {bids(5, 77), bids(67, 6001)}]

    def pick(names: set[str], baseline: bool) -> list[dict]:
        chosen = [r for r in rows if bids_of(r) in names]
        return [r for r in chosen if session_id(r["session_id"]) == "ses-M000"] if baseline else chosen

    def bids_of(row: dict) -> str:
        return next(bids(site, rid) for site, rid, *_ in SUBJECTS if subject_key(row["participant_id"]) == f"ADNI RID {rid}")

    everyone = {bids(site, rid) for site, rid, *_ in SUBJECTS}
    write_tsv(root / "labels.tsv", rows)
    write_tsv(split / "train.tsv", pick(everyone - test, False))
    write_tsv(split / "train_baseline.tsv", pick(everyone - test, True))
    write_tsv(split / "test_baseline.tsv", pick(test, True))
    for i, validation in enumerate(folds):
        fold = split / "2_fold" / f"split-{i}"
        write_tsv(fold / "train.tsv", pick(everyone - test - validation, False))
        write_tsv(fold / "train_baseline.tsv", pick(everyone - test - validation, True))
        write_tsv(fold / "validation_baseline.tsv", pick(validation, True))
        write_tsv(fold / "validation.tsv", pick(validation, False))
    return {"caps": caps, "split": split, "rows": rows, "test": test, "folds": folds, "everyone": everyone}




def keys(names: set[str]) -> set[str]:
    """The subject keys of BIDS participant names."""
    return {subject_key(n) for n in names}


# The split folders each ClinicaDL generation writes, recorded from its source (file names, folders,
# columns), for the cohort's subjects: ``test`` held out, ``folds`` the validation subjects of each fold.

def _chosen(cohort: dict, names: set[str], baseline: bool, columns: list[str]) -> list[dict]:
    rows = [r for r in cohort["rows"] if subject_key(r["participant_id"]) in keys(names)]
    if baseline:
        rows = [r for r in rows if session_id(r["session_id"]) == "ses-M000"]
    return [{c: r[c] for c in columns} for r in rows]


def _write(path: Path, rows: list[dict], columns: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(["\t".join(columns)] + ["\t".join(str(r[c]) for c in columns) for r in rows]) + "\n")


def write_clinicadl2_splits(cohort: dict, root: Path, stratification: str = "sex", longitudinal: bool = False,
                            subset_name: str = "validation", test_longitudinal: bool = False) -> Path:
    """ClinicaDL 2.0: ``make_split(labels.tsv, stratification=[sex], longitudinal=test_longitudinal)`` then
    ``make_kfold(split/train.tsv, n_splits=2, subset_name=subset_name, longitudinal=longitudinal)``
    (``clinicadl/split/make_splits``, ``write_to_tsv``): ``split/`` with ``train.tsv``, ``train_baseline.tsv``,
    ``test_baseline.tsv`` (and ``test.tsv``, every session of the test subjects, when longitudinal) and
    ``single_split_config.json``; ``split/2_fold/split-<i>/`` with ``train.tsv``, ``train_baseline.tsv``,
    ``<subset_name>_baseline.tsv`` (and ``<subset_name>.tsv`` when longitudinal), and ``kfold_config.json``
    (the config's fields: subset_name, stratification, longitudinal, seed, n_splits). Their columns:
    ``participant_id``, ``session_id`` and the stratification column, no diagnosis. Returns ``split/``."""
    columns = ["participant_id", "session_id", stratification]
    split = root / "split"
    train = cohort["everyone"] - cohort["test"]
    _write(split / "test_baseline.tsv", _chosen(cohort, cohort["test"], True, columns), columns)
    if test_longitudinal:
        _write(split / "test.tsv", _chosen(cohort, cohort["test"], False, columns), columns)
    _write(split / "train_baseline.tsv", _chosen(cohort, train, True, columns), columns)
    _write(split / "train.tsv", _chosen(cohort, train, False, columns), columns)
    (split / "single_split_config.json").write_text(json.dumps(
        {"subset_name": "test", "stratification": [stratification], "longitudinal": test_longitudinal, "seed": None,
         "n_test": 2, "p_categorical_threshold": 0.8, "p_continuous_threshold": 0.8}))
    for i, validation in enumerate(cohort["folds"]):
        fold = split / "2_fold" / f"split-{i}"
        _write(fold / f"{subset_name}_baseline.tsv", _chosen(cohort, validation, True, columns), columns)
        if longitudinal:
            _write(fold / f"{subset_name}.tsv", _chosen(cohort, validation, False, columns), columns)
        _write(fold / "train_baseline.tsv", _chosen(cohort, train - validation, True, columns), columns)
        _write(fold / "train.tsv", _chosen(cohort, train - validation, False, columns), columns)
    (split / "2_fold" / "kfold_config.json").write_text(json.dumps(
        {"subset_name": subset_name, "stratification": stratification, "longitudinal": longitudinal, "seed": None,
         "n_splits": 2}))
    return split


def write_clinicadl1_splits(cohort: dict, root: Path) -> Path:
    """ClinicaDL 1.0-1.1: ``tsvtool getlabels`` (a TSV per diagnosis), ``tsvtool split labels`` (``labels/train/`` and
    ``labels/test/``, a TSV per diagnosis, baseline and longitudinal) and ``tsvtool kfold labels/train --n_splits 2``
    (``labels/train/train_splits-2/split-<i>/<dx>[_baseline].tsv``, ``labels/train/validation_splits-2/split-<i>/
    <dx>_baseline.tsv``). Columns as getlabels writes them. Returns ``labels/train`` (``clinicadl train``'s tsv_path)."""
    labels = root / "labels"
    train = cohort["everyone"] - cohort["test"]
    diagnosis = {subject_key(r["participant_id"]): r["diagnosis"] for r in cohort["rows"]}

    def by_diagnosis(folder: Path, names: set[str], baseline_only: bool) -> None:
        for dx in ("AD", "CN"):
            mine = {n for n in names if diagnosis[subject_key(n)] in ({dx} if dx == "AD" else {"CN", "NC"})}
            _write(folder / f"{dx}_baseline.tsv", _chosen(cohort, mine, True, COLUMNS), COLUMNS)
            if not baseline_only:
                _write(folder / f"{dx}.tsv", _chosen(cohort, mine, False, COLUMNS), COLUMNS)

    by_diagnosis(labels, cohort["everyone"], False)
    by_diagnosis(labels / "train", train, False)
    by_diagnosis(labels / "test", cohort["test"], False)
    for i, validation in enumerate(cohort["folds"]):
        by_diagnosis(labels / "train" / "train_splits-2" / f"split-{i}", train - validation, False)
        by_diagnosis(labels / "train" / "validation_splits-2" / f"split-{i}", validation, True)
    return labels / "train"
