"""ClinicaDL's outputs as users have them: a CAPS folder and split TSVs written here by hand (not by our
generator), IDs spelled three ways, both Clinica file-name generations, .pt tensors; leakage refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from clinicadl_cohort import SUBJECTS, keys, make_cohort, write_tsv
from lightning_hybrid.data import ADNIDataModule, BadItemError
from lightning_hybrid.data.clinicadl_splits import split_files
from lightning_hybrid.data.clinicadl import (
    ClinicaDLFormatError, baseline_rows, label_code, read_tsv, session_id, subject_key,
)
from lightning_hybrid.data.leakage import LeakageError

SMALL = dict(view={"image_shape": (8, 8, 8), "spacing": (2.0, 2.0, 2.0)}, cache={"where": None, "threads": 2},
             augment={"where": None}, batch_size=2, num_workers=0)


@pytest.fixture
def cohort(tmp_path) -> dict:
    return make_cohort(tmp_path)


def subjects(scans) -> set[str]:
    return {s.subject for s in scans}


def test_identifiers_and_class_order_as_clinicadl_writes_them():
    assert len({subject_key(s) for s in ("002_S_0295", "sub-ADNI002S0295", "295", "ADNI002S0295")}) == 1
    assert subject_key("002_S_0295") != subject_key("002_S_0296")
    assert session_id("ses-M00") == session_id("ses-M000") == "ses-M000" and session_id("ses-M06") == "ses-M006"
    assert label_code(["CN", "AD"]) == {"AD": 0, "CN": 1} and label_code(["sMCI", "pMCI"]) == {"pMCI": 0, "sMCI": 1}


@pytest.mark.parametrize("tsv_path,split", [("split", 1), ("split/2_fold", 1)])
def test_a_clinicadl_cohort_loads_with_its_splits_used_as_given(cohort, tsv_path, split):
    dm = ADNIDataModule({"caps_directory": cohort["caps"], "tsv_path": cohort["caps"].parent / tsv_path},
                        split={"fold": split}, **SMALL)
    dm.setup()
    assert subjects(dm.splits["test"]) == keys(cohort["test"])
    assert subjects(dm.splits["val"]) == keys(cohort["folds"][1])
    assert subjects(dm.splits["train"]) == keys(cohort["everyone"] - cohort["test"] - cohort["folds"][1])
    assert dm.labels == ["AD", "CN"] and dm.positive_class == 0  # ClinicaDL's order; NC read as CN
    diagnosis = {f"ADNI RID {rid}": d for _, rid, d, _ in SUBJECTS}
    assert all(s.label == dm.labels.index(diagnosis[s.subject]) for scans in dm.splits.values() for s in scans)
    assert [s.session for s in dm.splits["train"] if s.subject == "ADNI RID 4200"] == ["ses-M000", "ses-M024"]
    image, label, key = dm.val_set[0]
    assert image.shape == (1, 8, 8, 8) and key.tolist()[0] == 0


def test_extracted_tensors_are_read_where_prepare_data_wrote_them(cohort):
    dm = ADNIDataModule({"caps_directory": cohort["caps"], "tsv_path": cohort["caps"].parent / "labels.tsv"},
                        split={"val_fraction": 0.25, "test_fraction": 0.25}, **SMALL)
    dm.setup()
    paths = {s.subject: s.path for scans in dm.splits.values() for s in scans if s.session == "ses-M000"}
    assert paths["ADNI RID 1004"].suffix == ".pt" and paths["ADNI RID 77"].suffix == ".pt"  # tensor-only, and both
    assert paths["ADNI RID 21"].name.endswith("_T1w.nii.gz") and "_T1w_space-" in paths["ADNI RID 21"].name  # older name
    preprocessed = dm.preprocessing(keep_meta=True)({"image": str(paths["ADNI RID 1004"])})["image"]
    assert np.allclose(preprocessed.affine[:3, :3].diag().abs().numpy(), 2.0)  # t1-linear's grid, resampled to 2 mm


def test_baseline_training_and_longitudinal_evaluation(cohort):
    common = dict(source={"caps_directory": cohort["caps"], "tsv_path": cohort["split"]}, **SMALL)
    dm = ADNIDataModule(split={"fold": 0, "baseline": True}, **common)
    dm.setup()
    assert all(s.session == "ses-M000" for s in dm.splits["train"])
    with pytest.raises(ClinicaDLFormatError, match=r"valid_longitudinal=true needs .*test.tsv"):  # said, not guessed
        ADNIDataModule(split={"fold": 0, "valid_longitudinal": True}, **common).setup()
    write_tsv(cohort["split"] / "test.tsv", [r for r in cohort["rows"] if subject_key(r["participant_id"]) in keys(cohort["test"])])
    dm = ADNIDataModule(split={"fold": 0, "valid_longitudinal": True}, **common)
    dm.setup()
    assert [s.session for s in dm.splits["test"] if s.subject == "ADNI RID 295"] == ["ses-M000", "ses-M012"]
    assert split_files(cohort["split"], 0, False, True).validation[0].name == "validation.tsv"


def test_rows_and_baseline_of_a_tsv(cohort):
    rows = read_tsv(cohort["caps"].parent / "labels.tsv")
    assert {r.diagnosis for r in rows} == {"AD", "CN"}
    assert len(baseline_rows(rows)) == len(SUBJECTS)


def write_split(cohort: dict, train: list[dict], validation: list[dict], test: list[dict]) -> Path:
    folder = cohort["caps"].parent / "leaky"
    write_tsv(folder / "train.tsv", train)
    write_tsv(folder / "validation_baseline.tsv", validation)
    write_tsv(folder / "test_baseline.tsv", test)
    return folder


def test_a_subject_in_two_splits_under_two_spellings_is_refused_naming_both(cohort):
    rows = cohort["rows"]
    by_rid = {subject_key(r["participant_id"]): r for r in rows if session_id(r["session_id"]) == "ses-M000"}
    leaked = {**by_rid["ADNI RID 21"], "participant_id": "011_S_0021"}  # PTID in train, BIDS in test
    test = [{**by_rid["ADNI RID 21"], "participant_id": "sub-ADNI011S0021"}, by_rid["ADNI RID 295"]]
    folder = write_split(cohort, [leaked, by_rid["ADNI RID 1004"], by_rid["ADNI RID 6001"]],
                         [by_rid["ADNI RID 77"], by_rid["ADNI RID 130"]], test)
    with pytest.raises(LeakageError, match=r"subject ADNI RID 21 \(spelled 011_S_0021, sub-ADNI011S0021\): it is in train and test"):
        ADNIDataModule({"caps_directory": cohort["caps"], "tsv_path": folder}, **SMALL).setup()


def test_a_subjects_sessions_split_across_train_and_test_are_refused(cohort):
    rows = cohort["rows"]
    m000 = {subject_key(r["participant_id"]): r for r in rows if session_id(r["session_id"]) == "ses-M000"}
    later = next(r for r in rows if subject_key(r["participant_id"]) == "ADNI RID 295" and r["session_id"] == "ses-M12")
    folder = write_split(cohort, [later, m000["ADNI RID 1004"], m000["ADNI RID 6001"]],
                         [m000["ADNI RID 77"], m000["ADNI RID 130"]], [m000["ADNI RID 295"], m000["ADNI RID 21"]])
    with pytest.raises(LeakageError, match=r"subject ADNI RID 295.*its sessions are split across train and test; "
                                           r"train: ses-M012.*test: ses-M000"):
        ADNIDataModule({"caps_directory": cohort["caps"], "tsv_path": folder}, **SMALL).setup()


def test_the_same_image_under_two_names_is_refused_by_its_content(cohort, tmp_path):
    caps = cohort["caps"]
    source = next((caps / "subjects" / "sub-ADNI011S0021").rglob("*_T1w.nii.gz"))
    target = next((caps / "subjects" / "sub-ADNI041S4200").rglob("*ses-M00*/t1_linear/*_T1w.nii.gz"))
    image = nib.load(source)
    nib.save(nib.Nifti1Image(np.asarray(image.dataobj), image.affine), target)  # re-saved: other gzip bytes, same voxels
    cache = tmp_path / "cache"
    with pytest.raises(LeakageError, match=r"the same image .* twice: .*011_S_0021|the same image .* twice: .*sub-ADNI041S4200") as raised:
        ADNIDataModule({"caps_directory": caps, "tsv_path": cohort["split"]}, split={"fold": 0},
                       **{**SMALL, "cache": {"where": None, "dir": cache, "threads": 2}}).setup()
    assert "sub-ADNI011S0021" in str(raised.value) or "011_S_0021" in str(raised.value) or "21 ses-M000" in str(raised.value)
    assert not any(p.suffix == ".pt" for p in cache.rglob("*")), "nothing preprocessed before the refusal"


def test_a_session_listed_twice_is_refused(cohort):
    rows = cohort["rows"]
    first = [r for r in rows if session_id(r["session_id"]) == "ses-M000"]
    folder = write_split(cohort, first[2:6] + [first[2]], first[6:8], first[:2])
    with pytest.raises(LeakageError, match="session listed twice"):
        ADNIDataModule({"caps_directory": cohort["caps"], "tsv_path": folder}, **SMALL).setup()
    ADNIDataModule({"caps_directory": cohort["caps"], "tsv_path": folder}, split={"skip_leak_check": True},
                   **SMALL).setup()  # said, then allowed


@pytest.mark.parametrize("case", ["missing_file", "no_participant_id", "unknown_diagnosis", "4d"])
def test_bad_input_is_named_and_nothing_is_written(cohort, tmp_path, case):
    caps, split = cohort["caps"], cohort["split"]
    if case == "missing_file":
        victim = next((caps / "subjects" / "sub-ADNI067S6001").rglob("*_T1w.nii.gz"))
        victim.unlink()
        expected = r"6001 ses-M00: no t1-linear image \(looked for .*subjects/sub-ADNI067S6001/ses-M00/t1_linear.*listed in .*split-1/validation_baseline.tsv, line \d"
    elif case == "no_participant_id":
        text = (split / "test_baseline.tsv").read_text().replace("participant_id", "subject")
        (split / "test_baseline.tsv").write_text(text)
        expected = r"test_baseline.tsv: no 'participant_id' column"
    elif case == "unknown_diagnosis":
        text = (split / "test_baseline.tsv").read_text().replace("\tAD\n", "\tMartian\n")
        (split / "test_baseline.tsv").write_text(text)
        expected = r"test_baseline.tsv, line \d: unknown diagnosis 'Martian'"
    else:
        victim = next((caps / "subjects" / "sub-ADNI067S6001").rglob("*_T1w.nii.gz"))
        nib.save(nib.Nifti1Image(np.zeros((8, 8, 8, 2), np.float32), np.eye(4)), victim)
        expected = r"sub-ADNI067S6001.*a 4D image of shape \(8, 8, 8, 2\)"
    cache = tmp_path / "cache"
    with pytest.raises((BadItemError, ClinicaDLFormatError), match=expected):
        ADNIDataModule({"caps_directory": caps, "tsv_path": split}, split={"fold": 1},
                       **{**SMALL, "cache": {"where": None, "dir": cache, "threads": 2}}).setup()
    assert not cache.exists() or not any(cache.iterdir()), "nothing written"


def test_a_folder_that_is_not_a_caps_or_a_split_is_refused_with_what_to_do(cohort, tmp_path):
    with pytest.raises(FileNotFoundError, match="not a CAPS folder.*make-adni-like"):
        ADNIDataModule({"caps_directory": tmp_path / "nowhere", "tsv_path": cohort["split"]})
    with pytest.raises(ClinicaDLFormatError, match=r"folds \[0, 1\] of a k-fold; choose one with split.fold=K"):
        ADNIDataModule({"caps_directory": cohort["caps"], "tsv_path": cohort["split"]}, split={"fold": None},
                       **SMALL).setup()
    with pytest.raises(ClinicaDLFormatError, match="no split-7"):
        ADNIDataModule({"caps_directory": cohort["caps"], "tsv_path": cohort["split"]}, split={"fold": 7},
                       **SMALL).setup()
    shutil.rmtree(cohort["split"] / "2_fold")
    with pytest.raises(ClinicaDLFormatError, match="needs train.tsv and validation_baseline.tsv"):
        ADNIDataModule({"caps_directory": cohort["caps"], "tsv_path": cohort["split"]}, **SMALL).setup()
