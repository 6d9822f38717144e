"""Every generation of ClinicaDL's split folders read as ``clinicadl train`` reads them, each fold really used;
diagnoses outside the task dropped and counted; images found as ClinicaDL finds them. The folders are written
in the layouts each generation's code writes (tests/clinicadl_cohort.py records them), not by our reader."""

from __future__ import annotations

import logging
import shutil

import pytest

from clinicadl_cohort import (
    SUBJECTS, keys, make_cohort, write_clinicadl1_splits, write_clinicadl2_splits, write_tsv,
)
from lightning_hybrid.data import ADNIDataModule
from lightning_hybrid.data.clinicadl import ClinicaDLFormatError, session_id, subject_key

SMALL = dict(view={"image_shape": (8, 8, 8), "spacing": (2.0, 2.0, 2.0)}, cache={"where": None, "threads": 2},
             augment={"where": None}, batch_size=2, num_workers=0)


@pytest.fixture
def cohort(tmp_path) -> dict:
    return make_cohort(tmp_path)


def subjects_of(dm: ADNIDataModule) -> dict[str, set[str]]:
    return {split: {s.subject for s in scans} for split, scans in dm.splits.items()}


def expected(cohort: dict, fold: int) -> dict[str, set[str]]:
    validation = cohort["folds"][fold]
    return {"train": keys(cohort["everyone"] - cohort["test"] - validation), "val": keys(validation),
            "test": keys(cohort["test"])}


def loaded(cohort: dict, tsv_path, split, **source) -> ADNIDataModule:
    dm = ADNIDataModule({"caps_directory": cohort["caps"], "tsv_path": tsv_path, **source}, split={"fold": split},
                        **SMALL)
    dm.setup()
    return dm


def diagnoses_right(cohort: dict, dm: ADNIDataModule) -> bool:
    diagnosis = {f"ADNI RID {rid}": d for _, rid, d, _ in SUBJECTS}
    return all(s.label == dm.labels.index(diagnosis[s.subject]) for scans in dm.splits.values() for s in scans)


def test_each_fold_of_a_kfold_beside_a_single_split_is_the_fold_asked_for(cohort):
    """tsvtools split --subset_name validation, then tsvtools kfold split/train.tsv: split=K is fold K, not the
    single split beside it; no fold asked for is the single split, as clinicadl train reads it."""
    split = cohort["split"]
    single_validation = cohort["folds"][1]
    write_tsv(split / "train.tsv", [r for r in cohort["rows"] if subject_key(r["participant_id"])
                                    in keys(cohort["everyone"] - cohort["test"] - single_validation)])
    write_tsv(split / "validation_baseline.tsv", [r for r in cohort["rows"] if subject_key(r["participant_id"])
                                                  in keys(single_validation) and session_id(r["session_id"]) == "ses-M000"])
    folds = [subjects_of(loaded(cohort, split, k)) for k in (0, 1)]
    assert folds == [expected(cohort, 0), expected(cohort, 1)]
    assert subjects_of(loaded(cohort, split, None)) == expected(cohort, 1) != folds[0]
    shutil.copytree(split / "2_fold", split / "2_fold_2")  # a second k-fold, as tsvtools names it
    with pytest.raises(ClinicaDLFormatError, match=r"2 k-folds \(2_fold, 2_fold_2\) and a single split: .* ambiguous"):
        loaded(cohort, split, 1)


def test_a_fold_asked_of_a_single_split_is_refused(cohort):
    shutil.rmtree(cohort["split"] / "2_fold")
    write_tsv(cohort["split"] / "validation_baseline.tsv", [])
    with pytest.raises(ClinicaDLFormatError, match=r"split.fold=2 asks for fold 2 of a k-fold, but .* is a single split"):
        loaded(cohort, cohort["split"], 2)


@pytest.mark.parametrize("where", ["found_above", "labels_tsv"])
def test_clinicadl2_splits_take_their_diagnoses_from_the_labels_tsv(cohort, tmp_path, where):
    root = tmp_path / "clinicadl2"
    (root / "labels.tsv").parent.mkdir(parents=True)
    shutil.copy(cohort["caps"].parent / "labels.tsv", root / "labels.tsv")
    split = write_clinicadl2_splits(cohort, root)
    assert "diagnosis" not in (split / "2_fold" / "split-1" / "train.tsv").read_text()
    extra = {}
    if where == "labels_tsv":
        (root / "labels.tsv").rename(tmp_path / "my_labels.tsv")
        (cohort["caps"].parent / "labels.tsv").unlink()  # no labels.tsv above the split any more
        with pytest.raises(ClinicaDLFormatError, match=r"no 'diagnosis' column .* make_split and make_kfold .* data.source.labels_tsv="):
            loaded(cohort, split, 1)
        extra = {"labels_tsv": tmp_path / "my_labels.tsv"}
    for fold in (0, 1):
        dm = loaded(cohort, split, fold, **extra)
        assert subjects_of(dm) == expected(cohort, fold) and diagnoses_right(cohort, dm)
    dm = loaded(cohort, split / "2_fold", 1, **extra)  # the k-fold folder itself: the test set beside it
    assert subjects_of(dm) == expected(cohort, 1)


def test_clinicadl1_per_diagnosis_files_are_read_for_the_tasks_diagnoses(cohort, tmp_path):
    train = write_clinicadl1_splits(cohort, tmp_path / "clinicadl1")
    for fold in (0, 1):
        dm = loaded(cohort, train, fold)
        assert subjects_of(dm) == expected(cohort, fold) and diagnoses_right(cohort, dm)
    assert sorted(s.session for s in loaded(cohort, train, 1).splits["train"] if s.subject == "ADNI RID 4200") == [
        "ses-M000", "ses-M024"]  # longitudinal training sessions, from CN.tsv
    with pytest.raises(ClinicaDLFormatError, match=r"folds \[0, 1\] of a k-fold; choose one with split.fold=K"):
        loaded(cohort, train, None)
    (train / "train_splits-2" / "split-1" / "CN.tsv").unlink()
    with pytest.raises(ClinicaDLFormatError, match=r"split-1: no CN.tsv \(ClinicaDL 1.x's TSV per diagnosis"):
        loaded(cohort, train, 1)


def test_diagnoses_outside_the_task_are_dropped_and_counted_unknown_ones_refused(cohort, caplog):
    rows = cohort["rows"]
    smc = [{**r, "participant_id": "999_S_9999", "diagnosis": "SMC"} for r in rows[:1]]
    mci = [{**r, "participant_id": "998_S_9998", "diagnosis": "LMCI"} for r in rows[:1]]
    labels = write_tsv(cohort["caps"].parent / "with_smc.tsv", rows + smc + mci)
    with caplog.at_level(logging.INFO, logger="lightning_hybrid.data.adni"):
        dm = ADNIDataModule({"caps_directory": cohort["caps"], "tsv_path": labels},
                            split={"val_fraction": 0.25, "test_fraction": 0.25}, **SMALL)
        dm.setup()
    assert "dropped 1 MCI, 1 SMC (diagnoses outside the task's AD, CN)" in caplog.text
    assert sum(len(v) for v in dm.splits.values()) == len({(r["participant_id"], r["session_id"]) for r in rows
                                                             if session_id(r["session_id"]) == "ses-M000"}) + 1  # + 295's M012 in train
    write_tsv(labels, rows + [{**rows[0], "diagnosis": "Martian"}])
    with pytest.raises(ClinicaDLFormatError, match=r"with_smc.tsv, line \d+: unknown diagnosis 'Martian'"):
        ADNIDataModule({"caps_directory": cohort["caps"], "tsv_path": labels}, **SMALL).setup()
    with pytest.raises(ValueError, match="diagnoses must be two or more of AD, CN, MCI, sMCI, pMCI"):
        ADNIDataModule({"caps_directory": cohort["caps"], "tsv_path": labels}, diagnoses=["SMC", "CN"], **SMALL)


def test_images_are_found_at_any_depth_in_any_case_and_the_latest_run_is_taken(cohort, caplog):
    caps = cohort["caps"]
    session = caps / "subjects" / "sub-ADNI011S0021" / "ses-M00"
    image = next(session.rglob("*_T1w.nii.gz"))
    deeper = session / "t1_linear" / "qc_passed" / image.name.replace("_T1w.nii.gz", "_t1w.nii.gz")
    deeper.parent.mkdir()
    image.rename(deeper)
    labels = cohort["caps"].parent / "labels.tsv"
    dm = ADNIDataModule({"caps_directory": caps, "tsv_path": labels},
                        split={"val_fraction": 0.25, "test_fraction": 0.25}, **SMALL)
    dm.setup()
    assert any(s.path == deeper for scans in dm.splits.values() for s in scans)
    for run in (1, 2):
        shutil.copy(deeper, deeper.parent / deeper.name.replace("_space-", f"_run-0{run}_space-"))
    deeper.unlink()
    with caplog.at_level(logging.WARNING):
        dm = ADNIDataModule({"caps_directory": caps, "tsv_path": labels},
                            split={"val_fraction": 0.25, "test_fraction": 0.25}, **SMALL)
        dm.setup()
    assert any(s.path.name.startswith("sub-ADNI011S0021_ses-M00_T1w_run-02") or "_run-02_" in s.path.name
               for scans in dm.splits.values() for s in scans)
    assert "2 runs of one scan" in caplog.text
    shutil.copy(deeper.parent / deeper.name.replace("_space-", "_run-02_space-"), session / "t1_linear" / image.name)
    with pytest.raises(ClinicaDLFormatError, match="3 t1-linear images match for one session"):
        ADNIDataModule({"caps_directory": caps, "tsv_path": labels}, **SMALL).setup()

