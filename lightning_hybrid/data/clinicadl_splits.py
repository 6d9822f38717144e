"""ClinicaDL's split folders, read as each generation of ClinicaDL reads them: which TSVs hold the train,
validation and test sessions (:func:`split_files`).

The generations' layouts: 1.2-1.6's ``tsvtools split``/``kfold`` (``train.tsv`` or ``train_baseline.tsv``,
``validation_baseline.tsv`` or ``validation.tsv``, ``split-<k>`` folders of a k-fold, the test subset beside
it), 2.0's ``make_split``/``make_kfold`` (the same names, and a record of each folder: ``kfold_config.json``,
``split_config.json``) and 1.0-1.1's TSV per diagnosis. One rule for a folder holding several layouts, the
same in every generation (:func:`_choose`). Plain Python; nothing here knows Lightning.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lightning_hybrid.data.clinicadl import ClinicaDLFormatError, diagnosis_label


@dataclass(frozen=True)
class SplitFiles:
    """The TSVs that hold the train, validation and (where there is one) test sessions, the layout they were
    found in (ClinicaDL 1.x writes one TSV per diagnosis, later versions one per subset), and whether the
    validation and test TSVs hold every session of their subjects (longitudinal) or the baseline ones."""

    train: tuple[Path, ...]
    validation: tuple[Path, ...]
    test: tuple[Path, ...]
    layout: str
    validation_longitudinal: bool = False
    test_longitudinal: bool = False


#: What a ClinicaDL 2.0 split folder says of itself: ``make_kfold``'s file, and ``make_split``'s (two spellings).
SPLIT_CONFIGS = ("kfold_config.json", "split_config.json", "single_split_config.json")


@dataclass(frozen=True)
class FolderConfig:
    """A ClinicaDL 2.0 split folder's own record (``subset_name``, ``longitudinal``), and where it was read."""

    subset_name: str
    longitudinal: bool
    path: Path


def folder_config(folder: Path) -> FolderConfig | None:
    """The record ClinicaDL 2.0's ``make_split``/``make_kfold`` wrote in ``folder`` (None: none, as before 2.0)."""
    path = next((folder / n for n in SPLIT_CONFIGS if (folder / n).is_file()), None)
    if path is None:
        return None
    try:
        record = json.loads(path.read_text())
        return FolderConfig(str(record.get("subset_name") or ("validation" if path.name.startswith("kfold") else "test")),
                            bool(record.get("longitudinal", False)), path)
    except (json.JSONDecodeError, AttributeError, TypeError) as err:
        raise ClinicaDLFormatError(f"{path}: not the JSON record ClinicaDL's make_split/make_kfold writes ({err})") from None


def _longitudinal(config: FolderConfig | None, asked: bool | None, what: str) -> bool:
    """Whether the ``what`` subset is read with every session: as its folder's record says, or as asked (None:
    the record, else baseline sessions); an explicit setting the record contradicts is refused naming both."""
    if config is None:
        return bool(asked)
    if asked is not None and asked != config.longitudinal:
        reads = f"{config.subset_name}.tsv" if config.longitudinal else f"{config.subset_name}_baseline.tsv"
        raise ClinicaDLFormatError(
            f"split.valid_longitudinal={str(asked).lower()}, but {config.path} says the {what} subset is "
            f"{'longitudinal' if config.longitudinal else 'baseline sessions only'} (ClinicaDL 2.0 reads {reads}): set "
            f"data.split.valid_longitudinal=null to read it as the folder says, or remake the split"
        )
    return config.longitudinal


def _first_existing(folder: Path, names: Sequence[str]) -> Path | None:
    return next((folder / n for n in names if (folder / n).is_file()), None)


def _fold_numbers(folder: Path) -> list[int]:
    return sorted(int(p.name[6:]) for p in folder.glob("split-*") if p.is_dir() and p.name[6:].isdigit())


def _pick_fold(folder: Path, split: int | None) -> Path:
    available = _fold_numbers(folder)
    if split is None:
        raise ClinicaDLFormatError(f"{folder} holds the folds {available} of a k-fold; choose one with split.fold=K (data.split.fold=K)")
    if split not in available:
        raise ClinicaDLFormatError(f"{folder}: no split-{split} (folds: {available})")
    return folder / f"split-{split}"


def _choose(tsv_path: Path, kfolds: Sequence[Path], single: bool, split: int | None, folds: int | None) -> Path | None:
    """Which layout of ``tsv_path`` is read: a k-fold folder of ``kfolds``, or None for the single split.

    One rule for every generation. Where ClinicaDL's choice is determined by what was given, as ClinicaDL: no
    fold asked for is the single split (``clinicadl train`` without ``--n_splits``); ``split.folds=N`` is the
    ``N``-fold (``--n_splits N``); a fold asked for where only a k-fold lies is that k-fold's. A fold asked for
    without ``split.folds`` where both lie is not determined: refused, naming both and how to pick each.
    """
    if not kfolds:
        if split not in (None, 0) or folds is not None:
            raise ClinicaDLFormatError(
                f"split.fold={split}{f' split.folds={folds}' if folds is not None else ''} asks for a fold of a k-fold, but "
                f"{tsv_path} is a single split (no split-<k>, <n>_fold or train_splits-<n> folders in it): leave "
                "data.split.fold and data.split.folds unset (null), or point tsv_path at the k-fold folder of clinicadl "
                "tsvtools kfold"
            )
        return None
    if folds is not None:
        named = [p for p in kfolds if p.name in (f"{folds}_fold", f"train_splits-{folds}") or len(_fold_numbers(p)) == folds]
        if not named:
            raise ClinicaDLFormatError(f"split.folds={folds}, but {tsv_path} holds {', '.join(p.name for p in kfolds)}: "
                                       f"set data.split.folds to its number of folds")
        kfolds = named
    elif single and split is None:
        return None  # the single split, as clinicadl train without --n_splits reads it
    elif single:
        counts = sorted({len(_fold_numbers(p)) for p in kfolds})
        raise ClinicaDLFormatError(
            f"{tsv_path} holds a single split and a k-fold ({', '.join(p.name for p in kfolds)}), and split.fold={split} "
            f"without split.folds names neither: data.split.fold=null reads the single split (clinicadl train without "
            f"--n_splits); data.split.folds={counts[0]} data.split.fold={split} reads fold {split} of the k-fold "
            f"(--n_splits {counts[0]} --split {split})"
        )
    if len(kfolds) > 1:
        raise ClinicaDLFormatError(
            f"{tsv_path} holds {len(kfolds)} k-folds ({', '.join(p.name for p in kfolds)})"
            f"{' and a single split' if single else ''}: which one is meant is ambiguous; point tsv_path at one of "
            f"{', '.join(str(p) for p in kfolds)}"
        )
    return kfolds[0]


def split_files(tsv_path: Path, split: int | None, baseline: bool, valid_longitudinal: bool | None,
                diagnoses: Sequence[str] = (), folds: int | None = None) -> SplitFiles:
    """The files of a ClinicaDL split folder, as that generation of ClinicaDL reads them.

    Which of the folder's layouts (a k-fold, a single split, both) is read, whatever the generation:
    :func:`_choose`. ``split`` is the fold (ClinicaDL's ``--split``), ``folds`` its number of folds
    (``--n_splits``); a k-fold folder itself (``split-<k>`` inside) needs a fold.

    ClinicaDL 1.2 and later (and 2.0's ``make_split``/``make_kfold``) write a TSV per subset: training reads
    ``train_baseline.tsv`` with ``baseline``, else ``train.tsv``; validation ``validation.tsv`` when
    longitudinal, else ``validation_baseline.tsv``; the test sessions the same way from ``test[_baseline].tsv``
    beside the k-fold folder (or in the single split). ClinicaDL 2.0 records each folder's subset name and
    whether it is longitudinal (``kfold_config.json``, ``split_config.json``): read as recorded, so that
    ``valid_longitudinal=None`` gives the sets 2.0's ``KFold``/``SingleSplit`` give, and an explicit setting the
    record contradicts is refused naming both; without a record ``None`` means baseline sessions (1.x's default).

    ClinicaDL 1.0-1.1 wrote a TSV per diagnosis: ``tsv_path`` holds ``train_splits-<n>/split-<k>/`` and
    ``validation_splits-<n>/split-<k>/`` (a k-fold) and/or ``train/`` and ``validation/`` (a single split),
    with ``<diagnosis>.tsv`` and ``<diagnosis>_baseline.tsv`` in each; the test subset is the ``test/``
    folder beside ``tsv_path``. Only the files of ``diagnoses`` are read, as ClinicaDL reads them.
    """
    tsv_path = Path(tsv_path)
    if not tsv_path.is_dir():
        raise ClinicaDLFormatError(f"{tsv_path}: no such split folder")
    if any(tsv_path.glob("train_splits-*")) or _per_diagnosis(tsv_path / "train"):
        return _per_diagnosis_files(tsv_path, split, baseline, bool(valid_longitudinal), diagnoses, folds)
    if _fold_numbers(tsv_path):  # the k-fold folder itself; its test set beside it
        kfold, test_folder, layout = tsv_path, tsv_path.parent, "k-fold"
        fold_folder = _pick_fold(kfold, split)
    else:
        kfolds = sorted(p for p in tsv_path.glob("*_fold*") if p.is_dir() and _fold_numbers(p))
        own = folder_config(tsv_path)
        subset = own.subset_name if own is not None and own.subset_name != "test" else "validation"
        single = any((tsv_path / f"{subset}{end}").is_file() for end in ("_baseline.tsv", ".tsv"))
        kfold, test_folder = _choose(tsv_path, kfolds, single, split, folds), tsv_path
        fold_folder = _pick_fold(kfold, split) if kfold is not None else tsv_path
        layout = "k-fold" if kfold is not None else "single split"
    validation_config = folder_config(kfold) if kfold is not None else folder_config(tsv_path)
    if validation_config is not None and validation_config.subset_name == "test":
        validation_config = None  # make_split's test subset: no validation of its own
    test_config = folder_config(test_folder)
    if test_config is not None and test_config.subset_name != "test":
        test_config = None
    validation_long = _longitudinal(validation_config, valid_longitudinal, "validation")
    validation_name = validation_config.subset_name if validation_config is not None else "validation"
    test_name = test_config.subset_name if test_config is not None else "test"
    train_names = ("train_baseline.tsv",) if baseline else ("train.tsv",)
    valid_names = (f"{validation_name}.tsv",) if validation_long else (f"{validation_name}_baseline.tsv",)
    train, validation = _first_existing(fold_folder, train_names), _first_existing(fold_folder, valid_names)
    if train is None or validation is None:
        present = sorted(p.name for p in fold_folder.glob("*.tsv"))
        raise ClinicaDLFormatError(
            f"{fold_folder}: needs {train_names[0]} and {valid_names[0]} (ClinicaDL's split files; baseline="
            f"{baseline}, longitudinal validation={validation_long}); it holds {present}"
        )
    test_long = _longitudinal(test_config, valid_longitudinal, "test") if test_config is not None else validation_long
    test = _first_existing(test_folder, (f"{test_name}.tsv",) if test_long else (f"{test_name}_baseline.tsv",))
    if test is None and test_long and (test_folder / f"{test_name}_baseline.tsv").is_file():
        raise ClinicaDLFormatError(
            f"valid_longitudinal=true needs {test_folder / f'{test_name}.tsv'} (every session of the test subjects: "
            f"clinicadl tsvtools split --valid_longitudinal); there is only {test_name}_baseline.tsv"
        )
    return SplitFiles((train,), (validation,), (test,) if test else (), layout, validation_long, test_long)


def _per_diagnosis(folder: Path) -> bool:
    """Whether ``folder`` holds ClinicaDL 1.x's per-diagnosis TSVs (``AD.tsv``, ``CN_baseline.tsv``, ...)."""
    return any(diagnosis_label(p.name.removesuffix(".tsv").removesuffix("_baseline")) for p in folder.glob("*.tsv"))


def _per_diagnosis_files(tsv_path: Path, split: int | None, baseline: bool, valid_longitudinal: bool,
                         diagnoses: Sequence[str], folds: int | None) -> SplitFiles:
    kfolds = sorted(p for p in tsv_path.glob("train_splits-*") if p.is_dir())
    single = _per_diagnosis(tsv_path / "train") and (tsv_path / "validation").is_dir()
    kfold = _choose(tsv_path, kfolds, single, split, folds)
    if kfold is not None:
        train_folder = _pick_fold(kfold, split)
        validation_folder = tsv_path / kfold.name.replace("train_", "validation_", 1) / train_folder.name
        layout = "ClinicaDL 1.x k-fold, a TSV per diagnosis"
    else:
        train_folder, validation_folder = tsv_path / "train", tsv_path / "validation"
        layout = "ClinicaDL 1.x single split, a TSV per diagnosis"
    suffix = {True: "_baseline.tsv", False: ".tsv"}

    def files(folder: Path, base: bool, required: bool) -> tuple[Path, ...]:
        wanted = [folder / f"{d}{suffix[base]}" for d in diagnoses]
        missing = [p.name for p in wanted if not p.is_file()]
        if missing and (required or len(missing) < len(wanted)):
            present = sorted(p.name for p in folder.glob("*.tsv")) if folder.is_dir() else "nothing (no such folder)"
            raise ClinicaDLFormatError(f"{folder}: no {', '.join(missing)} (ClinicaDL 1.x's TSV per diagnosis of "
                                       f"{', '.join(diagnoses)}; baseline={base}); it holds {present}")
        return tuple(wanted) if not missing else ()

    return SplitFiles(files(train_folder, baseline, True), files(validation_folder, not valid_longitudinal, True),
                      files(tsv_path.parent / "test", not valid_longitudinal, False), layout, valid_longitudinal,
                      valid_longitudinal)
