"""Every generation of ClinicaDL's split folders read as ``clinicadl train`` reads them, each fold really used;
diagnoses outside the task dropped and counted; images found as ClinicaDL finds them. The folders are written
in the layouts each generation's code writes (tests/support/clinicadl_cohort.py records them), not by our reader."""

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


def loaded_as(cohort: dict, tsv_path, **split) -> ADNIDataModule:
    dm = ADNIDataModule({"caps_directory": cohort["caps"], "tsv_path": tsv_path}, split=split, **SMALL)
    dm.setup()
    return dm


def sessions_of(dm: ADNIDataModule) -> dict[str, set[tuple[str, str]]]:
    return {split: {(s.subject, s.session) for s in scans} for split, scans in dm.splits.items()}


def cohort_sessions(cohort: dict, names: set[str], baseline: bool) -> set[tuple[str, str]]:
    chosen = {(subject_key(r["participant_id"]), session_id(r["session_id"])) for r in cohort["rows"]
              if subject_key(r["participant_id"]) in keys(names)}
    return {(s, t) for s, t in chosen if t == "ses-M000"} if baseline else chosen


# ClinicaDL's rules, as its code reads a split folder (the tests cannot install it):
# - 1.6.1 (`clinicadl train CAPS PREP TSV_PATH ...`, `split_manager`): with `--n_splits N` it reads
#   TSV_PATH/split-K/ (K of --split), else the single split in TSV_PATH itself; train.tsv (train_baseline.tsv with
#   --baseline), validation_baseline.tsv (validation.tsv with --valid_longitudinal).
# - 1.0-1.1 (a TSV per diagnosis): with --n_splits N, TSV_PATH/train_splits-N/split-K/<dx>.tsv and
#   validation_splits-N/split-K/<dx>_baseline.tsv; without, TSV_PATH/train/<dx>.tsv and validation/<dx>_baseline.tsv.
# - 2.0 (`KFold(split_dir)`, `SingleSplit(split_dir)`): the folder's kfold_config.json / single_split_config.json
#   names the subset and says whether it is longitudinal; training reads train.tsv, validation <subset>.tsv when
#   longitudinal, else <subset>_baseline.tsv.
# Here a fold without split.folds, where both a single split and a k-fold lie, determines nothing: refused.

def write_single_split_beside(cohort: dict) -> set[str]:
    """1.6.1's `tsvtools split split/train.tsv --subset_name validation` beside the k-fold: fold 1's validation
    subjects, so that the single split's sets differ from fold 0's."""
    split, single_validation = cohort["split"], cohort["folds"][1]
    train = cohort["everyone"] - cohort["test"] - single_validation
    write_tsv(split / "train.tsv", [r for r in cohort["rows"] if subject_key(r["participant_id"]) in keys(train)])
    write_tsv(split / "validation_baseline.tsv", [r for r in cohort["rows"] if subject_key(r["participant_id"])
                                                  in keys(single_validation) and session_id(r["session_id"]) == "ses-M000"])
    return single_validation


def test_clinicadl161_a_single_split_beside_a_kfold_is_read_as_clinicadl_train_reads_it(cohort):
    """No fold: the single split (clinicadl train without --n_splits); folds=2 and fold=K: the k-fold's fold K
    (--n_splits 2 --split K); a fold without folds is refused naming both choices."""
    write_single_split_beside(cohort)
    split = cohort["split"]
    assert subjects_of(loaded_as(cohort, split)) == expected(cohort, 1)  # the single split: fold 1's subjects
    assert subjects_of(loaded_as(cohort, split, fold=0, folds=2)) == expected(cohort, 0)
    assert subjects_of(loaded_as(cohort, split, fold=1, folds=2)) == expected(cohort, 1)
    for fold in (0, 1):
        with pytest.raises(ClinicaDLFormatError, match=rf"a single split and a k-fold \(2_fold\), and split.fold={fold} "
                           rf"without split.folds names neither: data.split.fold=null reads the single split .* "
                           rf"data.split.folds=2 data.split.fold={fold} reads fold {fold} of the k-fold"):
            loaded_as(cohort, split, fold=fold)
    with pytest.raises(ClinicaDLFormatError, match=r"split.folds=5, but .* holds 2_fold: set data.split.folds"):
        loaded_as(cohort, split, fold=0, folds=5)
    shutil.copytree(split / "2_fold", split / "2_fold_2")  # a second k-fold, as tsvtools names it
    with pytest.raises(ClinicaDLFormatError, match=r"2 k-folds \(2_fold, 2_fold_2\) and a single split: .* ambiguous"):
        loaded_as(cohort, split, fold=1, folds=2)


def test_clinicadl1_a_single_split_beside_a_kfold_follows_the_same_rule(cohort, tmp_path):
    train = write_clinicadl1_splits(cohort, tmp_path / "clinicadl1")
    single_validation = cohort["folds"][1]
    for folder, names, baseline_only in ((train / "train", cohort["everyone"] - cohort["test"] - single_validation, False),
                                         (train / "validation", single_validation, True)):
        for dx, spelled_as in (("AD", {"AD"}), ("CN", {"CN", "NC"})):
            rows = [r for r in cohort["rows"] if subject_key(r["participant_id"]) in keys(names) and r["diagnosis"] in spelled_as]
            write_tsv(folder / f"{dx}_baseline.tsv", [r for r in rows if session_id(r["session_id"]) == "ses-M000"])
            if not baseline_only:
                write_tsv(folder / f"{dx}.tsv", rows)
    assert subjects_of(loaded_as(cohort, train)) == expected(cohort, 1)  # was refused: 1.6.1 reads the single split
    assert subjects_of(loaded_as(cohort, train, fold=0, folds=2)) == expected(cohort, 0)
    with pytest.raises(ClinicaDLFormatError, match=r"a single split and a k-fold \(train_splits-2\), and split.fold=0"):
        loaded_as(cohort, train, fold=0)


@pytest.mark.parametrize("subset_name", ["validation", "val"])
def test_clinicadl2_longitudinal_kfold_is_read_as_its_record_says(cohort, tmp_path, subset_name):
    """make_kfold(longitudinal=True): 2.0's KFold validates on <subset>.tsv, every session of the validation
    subjects; make_split(longitudinal=True): the test set is test.tsv. Read so without being told; an explicit
    setting against the record is refused naming both."""
    root = tmp_path / "clinicadl2"
    root.mkdir()
    shutil.copy(cohort["caps"].parent / "labels.tsv", root / "labels.tsv")
    split = write_clinicadl2_splits(cohort, root, longitudinal=True, subset_name=subset_name, test_longitudinal=True)
    for fold in (0, 1):
        dm = loaded_as(cohort, split, fold=fold)
        got = sessions_of(dm)
        assert got["val"] == cohort_sessions(cohort, cohort["folds"][fold], baseline=False)  # 2.0's KFold: validation.tsv
        assert got["test"] == cohort_sessions(cohort, cohort["test"], baseline=False)  # 2.0: test.tsv
        assert len(got["test"]) > len(cohort_sessions(cohort, cohort["test"], baseline=True))
        assert got["train"] == cohort_sessions(cohort, cohort["everyone"] - cohort["test"] - cohort["folds"][fold], False)
    with pytest.raises(ClinicaDLFormatError, match=r"split.valid_longitudinal=false, but .*kfold_config.json says the "
                       r"validation subset is longitudinal .* data.split.valid_longitudinal=null"):
        loaded_as(cohort, split, fold=0, valid_longitudinal=False)
    baseline_root = tmp_path / "clinicadl2_baseline"
    baseline_root.mkdir()
    shutil.copy(cohort["caps"].parent / "labels.tsv", baseline_root / "labels.tsv")
    baseline = write_clinicadl2_splits(cohort, baseline_root, subset_name=subset_name)
    got = sessions_of(loaded_as(cohort, baseline, fold=1))
    assert got["val"] == cohort_sessions(cohort, cohort["folds"][1], baseline=True)
    assert got["test"] == cohort_sessions(cohort, cohort["test"], baseline=True)
    with pytest.raises(ClinicaDLFormatError, match=r"split.valid_longitudinal=true, but .* baseline sessions only"):
        loaded_as(cohort, baseline, fold=1, valid_longitudinal=True)


def test_a_fold_asked_of_a_single_split_is_refused(cohort):
    shutil.rmtree(cohort["split"] / "2_fold")
    write_tsv(cohort["split"] / "validation_baseline.tsv", [])
    with pytest.raises(ClinicaDLFormatError, match=r"split.fold=2 asks for a fold of a k-fold, but .* is a single split"):
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

