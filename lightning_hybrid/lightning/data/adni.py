# Generated from lightning_hybrid/data/adni.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""ADNI structural MRI for AD vs CN and pMCI vs sMCI: ClinicaDL's CAPS and TSVs or a CSV, split by
subject with leakage refused, preprocessed with MONAI."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from lightning_hybrid.lightning.data import clinicadl
from lightning_hybrid.lightning.data.base import EpochSeededRandomSampler, InMemoryDataModule
from lightning_hybrid.data.adni_settings import FLAT_NAMES, Augment, Cache, Source, Split, View, moved_keywords, settings
from lightning_hybrid.data.clinicadl import ClinicaDLFormatError, Row
from lightning_hybrid.data.clinicadl_splits import split_files
from lightning_hybrid.data.adni_csv import read_csv_rows
from lightning_hybrid.data.leakage import Scan, check_leakage
from lightning_hybrid.data.split import check_splits, split_subjects
from lightning_hybrid.data.volume_augment import VolumeAugment
from lightning_hybrid.data.volume_datasets import Volumes, VolumesOn, in_threads
from lightning_hybrid.data.volume_files import BadItemError, InspectionCache

log = logging.getLogger(__name__)

#: Tasks by name: the diagnoses they compare (ClinicaDL's ``diagnoses``).
TASKS = {"AD_vs_CN": ("AD", "CN"), "AD_vs_NC": ("AD", "CN"), "pMCI_vs_sMCI": ("pMCI", "sMCI")}


class ADNIDataModule(InMemoryDataModule):
    """Structural MRI of AD vs CN or pMCI vs sMCI, as ClinicaDL's users have it or listed in a CSV.

    Its settings come in groups (:mod:`lightning_hybrid.data.adni_settings`; each a dataclass or a
    mapping of its fields, a key of ``data`` under Hydra): ``source`` (ClinicaDL's outputs or a CSV),
    ``split`` (folds, fractions, sessions, the leakage check), ``view`` (the preprocessing), ``augment``
    and ``cache``; the task and the loader's settings are plain arguments, as for every datamodule here.

    **ClinicaDL's outputs** (``source.caps_directory`` and ``source.tsv_path``, ClinicaDL's parameter
    names): the t1-linear image of each session in the CAPS folder (``use_uncropped_image`` for the
    uncropped one; ClinicaDL's extracted ``.pt`` tensor where ``clinicadl prepare-data`` wrote one).
    ``tsv_path`` is a TSV (``participant_id``, ``session_id``, ``diagnosis``: split here by subject) or
    one of ClinicaDL's split folders, read as that generation of ClinicaDL reads it
    (:func:`~lightning_hybrid.data.clinicadl_splits.split_files`): a single split (``train.tsv``,
    ``validation_baseline.tsv``), a k-fold folder (``split-<k>`` folders, ``split.fold`` picks one:
    ClinicaDL's ``--split``), or the ``split/`` folder of ``tsvtools split`` holding ``test_baseline.tsv``
    and its k-fold; where a single split and a k-fold lie side by side, no fold is the single split (as
    ``clinicadl train`` without ``--n_splits``), ``split.folds=N`` with ``split.fold=K`` fold K of the
    ``N``-fold, and a fold without ``split.folds`` is refused naming both; several k-folds are refused as
    ambiguous. ClinicaDL 1.0-1.1's TSV per diagnosis (``train_splits-5/split-K/AD.tsv``) too. Split TSVs
    without a diagnosis column (ClinicaDL 2.0's ``make_split``/``make_kfold``) take it from
    ``source.labels_tsv``, or from a ``labels.tsv`` up to four folders above, where ClinicaDL's tsvtools
    look; 2.0's record of each folder (``kfold_config.json``: its subset's name, longitudinal or not) is
    followed. Rows of diagnoses outside the task (``SMC``, ``MCI`` in AD vs CN) are dropped, counted in the
    log. ``split.baseline`` trains on baseline sessions only; validation and test use baseline sessions
    unless ``split.valid_longitudinal`` or the split folder's record says otherwise (as ClinicaDL, and as
    the field reports).

    **A CSV** (``source.csv_path``): a subject, an image path (relative to the CSV's folder or
    ``source.root``, or absolute), a diagnosis and optionally a session column; ADNI's usual column
    names and diagnosis spellings are accepted. Split here by subject (stratified by class, seeded),
    optionally as a k-fold (``split.folds``, ``split.fold`` the test fold).

    Labels are ClinicaDL's (``CN``, ``AD``, ``sMCI``, ``pMCI``; ``NC`` and ``Dementia`` are read as
    ``CN`` and ``AD``) and so is the class order (sorted: AD 0, CN 1; pMCI 0, sMCI 1): a checkpoint's
    class 0 is the disease in both tasks. ``diagnoses`` picks the labels (``task`` names a pair).

    **Leakage is refused before training** (:mod:`lightning_hybrid.data.leakage`): ADNI's three
    spellings of a subject (PTID ``002_S_0295``, BIDS ``sub-ADNI002S0295``, RID ``295``) are one
    subject and ``ses-M00`` is ``ses-M000``; a session listed twice, a subject in two splits and the
    same image under two names (its voxels' hash) each stop the run naming the offenders.

    Preprocessing with MONAI (:class:`~lightning_hybrid.data.adni_settings.View`): canonical (RAS)
    orientation, resampling to ``view.spacing`` mm, intensity normalization over the non-zero voxels,
    crop or pad to ``view.image_shape`` about the centre (the default, 112 x 136 x 120 voxels of 1.5 mm,
    holds a whole brain), optional downsampling by an integer factor.

    Feeding a GPU (:class:`~lightning_hybrid.data.adni_settings.Cache`): the deterministic preprocessing
    runs once per volume. ``cache.where="memory"`` holds the preprocessed volumes in memory (built at setup,
    ``cache.threads`` at a time); ``"device"`` moves them once more, to the training device, where
    batches are gathered without loader workers, pinning or copies (MONAI's fast-training advice: cache
    on the GPU; it takes ``4 x voxels`` bytes per scan of the device's memory, 7.3 MB at the default
    view); ``"auto"`` (the default) is ``"device"`` on a CUDA device when the three splits take at most a
    quarter of its free memory and augmentation runs on the device, else ``"memory"``; ``"disk"`` reads
    them from ``cache.dir`` at every access, ``None`` preprocesses at every access. With ``cache.dir``
    set they also persist there between runs (MONAI's ``PersistentDataset``, keyed by the file and the
    view), as do the volumes' checks and hashes, so a later run, or another process of this one, reads
    instead of decoding. Training augmentation (:class:`~lightning_hybrid.data.adni_settings.Augment`:
    random flips, small affine transforms, Gaussian noise) runs on the batch after it reached the
    training device (``augment.where="device"``:
    :class:`~lightning_hybrid.data.volume_augment.VolumeAugment`, a few batched tensor operations) or
    per sample in the DataLoader's workers (``augment.where="workers"``, MONAI's random transforms).
    Loaders use ``num_workers`` worker processes (``"auto"``: 2 unless augmenting in the workers, else
    up to 8 within this process's share of the cores), kept alive between epochs, pinned memory when
    CUDA is present (``pin_memory="auto"``) and ``prefetch_factor`` batches in flight per worker.

    Validation and test batches are ``(image, label, key)`` (see :class:`~lightning_hybrid.data.volume_datasets.Volumes`); the
    :class:`~lightning_hybrid.ClassifierModule` reports balanced accuracy, sensitivity, specificity and
    AUC per scan and per subject from them, and ``val/bacc`` picks checkpoints (:attr:`monitor`).

    A missing, corrupt, truncated, 2D or 4D image, an unknown diagnosis or a missing column raise
    an error naming the file or line; with ``source.on_bad_file="skip"`` bad images are skipped,
    counted and listed in the log.

    Example::

        >>> # lightning-hybrid data make-adni-like cohort --subjects 40
        >>> dm = ADNIDataModule({"caps_directory": "cohort/caps", "tsv_path": "cohort/split"},
        ...                     split={"fold": 0})  # doctest: +SKIP
        >>> dm = ADNIDataModule(Source(csv_path="synth/adni.csv"), view=View(image_shape=(64, 64, 64)),
        ...                     batch_size=4)  # doctest: +SKIP
    """

    drop_last_train = True  # small 3D batches and BatchNorm: never a training batch of one
    #: The metric that picks checkpoints and stops early, and its direction (the CLI's ``monitor=auto``).
    monitor = ("val/bacc", "max")

    def __init__(
        self,
        source: Source | Mapping[str, Any] | None = None,
        task: str = "AD_vs_CN",
        diagnoses: Sequence[str] | None = None,
        split: Split | Mapping[str, Any] = Split(),
        view: View | Mapping[str, Any] = View(),
        augment: Augment | Mapping[str, Any] | None = Augment(),
        cache: Cache | Mapping[str, Any] | None = Cache(),
        batch_size: int = 6,
        seed: int = 0,
        num_workers: int | str = "auto",
        pin_memory: bool | str = "auto",
        prefetch_factor: int = 4,
        **moved: Any,
    ) -> None:
        if moved:  # a keyword of the datamodule before its settings were grouped: say where it went
            where, unknown = moved_keywords(moved), [k for k in moved if k not in FLAT_NAMES]
            raise TypeError("\n".join(
                ([f"ADNIDataModule's settings are in groups now:\n{where}"] if where else [])
                + ([f"ADNIDataModule got unexpected keyword argument(s) {', '.join(map(repr, unknown))}"] if unknown else [])))
        if source is None:
            raise TypeError("ADNIDataModule needs source=: Source(caps_directory=..., tsv_path=...) for ClinicaDL's "
                            "outputs, or Source(csv_path=...) for a CSV of images and diagnoses")
        super().__init__()
        if diagnoses is None:
            if task not in TASKS:
                raise ValueError(f"unknown task {task!r}; choose one of {sorted(TASKS)}, or set diagnoses=[...]")
            diagnoses = TASKS[task]
        unknown = [d for d in diagnoses if clinicadl.diagnosis_label(d) not in clinicadl.SEVERITY]
        if unknown or len(set(diagnoses)) < 2:
            raise ValueError(f"diagnoses must be two or more of AD, CN, MCI, sMCI, pMCI; got {list(diagnoses)}")
        self.source, self.split = settings(Source, source), settings(Split, split)
        self.view, self.augment, self.cache = settings(View, view), settings(Augment, augment), settings(Cache, cache)
        self.source.check_exists()
        if self.cache.where == "device" and self.augment.where == "workers":
            raise ValueError("cache.where='device' holds the volumes on the training device, where loader workers cannot "
                             "augment them: set augment.where=device (or cache.where=memory)")
        if not (num_workers == "auto" or (isinstance(num_workers, int) and num_workers >= 0)):
            raise ValueError(f"num_workers must be 'auto' or a non-negative integer, got {num_workers!r}")
        # plain values only: the hyperparameters go into checkpoints read with weights_only=True
        groups = {"source": self.source, "split": self.split, "view": self.view, "augment": self.augment,
                  "cache": self.cache}
        self.save_hyperparameters(
            {"task": task, "diagnoses": sorted({clinicadl.diagnosis_label(d) for d in diagnoses}),
             **{name: asdict(group) for name, group in groups.items()}, "batch_size": batch_size, "seed": seed,
             "num_workers": num_workers, "pin_memory": pin_memory, "prefetch_factor": prefetch_factor},
            logger=False,
        )
        self.skipped: list[str] = []
        self._labels = clinicadl.read_labels(Path(self.source.labels_tsv)) if self.source.labels_tsv else None
        self.subject_codes: dict[str, int] = {}
        self._device_augment: VolumeAugment | None = None
        self._on_device: dict[int, Dataset] = {}  # id(split dataset) -> its copy on the training device

    # ------------------------------------------------------------------ labels
    @property
    def labels(self) -> list[str]:
        """The class names in class order (ClinicaDL's: sorted, so the disease is class 0 of both tasks)."""
        return list(self.hparams.diagnoses)

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    @property
    def positive_class(self) -> int:
        """The disease class (AD of AD/CN, pMCI of pMCI/sMCI): what sensitivity and AUC are of."""
        return self.labels.index(clinicadl.disease_label(self.labels))

    # ------------------------------------------------------------------ reading
    def _rows(self) -> dict[str, list[tuple[Row, Path | None]]] | list[tuple[Row, Path | None]]:
        """The cohort's rows with their images: one list to split here, or ClinicaDL's given splits."""
        source = self.source
        skipped = self.skipped if source.on_bad_file == "skip" else None
        if source.csv_path is not None:
            return read_csv_rows(Path(source.csv_path), Path(source.root) if source.root else None, skipped)
        tsv_path = Path(source.tsv_path)
        if tsv_path.is_file():
            return [(row, None) for row in self._read_tsvs([tsv_path], skipped)]
        files = split_files(tsv_path, self.split.fold, self.split.baseline, self.split.valid_longitudinal,
                                      self.labels, self.split.folds)
        self.longitudinal = {"val": files.validation_longitudinal, "test": files.test_longitudinal}
        log.info("ClinicaDL split (%s): train %s, validation %s, test %s", files.layout, *(
            ", ".join(map(str, paths)) or "none" for paths in (files.train, files.validation, files.test)))
        given = {"train": files.train, "val": files.validation, "test": files.test}
        return {split: [(row, None) for row in self._read_tsvs(paths, skipped)] for split, paths in given.items()}

    def _read_tsvs(self, paths: Sequence[Path], skipped: list[str] | None) -> list[Row]:
        """The rows of ClinicaDL TSVs, their diagnoses from ``labels_tsv`` (or a ``labels.tsv`` above them, where
        ClinicaDL's tsvtools look) where a TSV has none, as ClinicaDL 2.0's splits have none."""
        rows = []
        for path in paths:
            try:
                rows += clinicadl.read_tsv(path, skipped, self._labels)
            except clinicadl.NoDiagnosisError:
                found = clinicadl.find_labels_tsv(path.parent)
                if found is None:
                    raise
                log.info("%s has no diagnosis column: diagnoses from %s (the labels.tsv above it, where ClinicaDL's "
                         "tsvtools look; labels_tsv= names another)", path, found)
                self._labels = clinicadl.read_labels(found)
                rows += clinicadl.read_tsv(path, skipped, self._labels)
        return rows

    def _scan(self, row: Row, image: Path | None) -> Scan:
        source = f"{row.source.name}, line {row.line}"
        if image is None:
            try:
                image = clinicadl.t1_linear_image(Path(self.source.caps_directory), row.participant, row.session,
                                                   not self.source.use_uncropped_image)
            except ClinicaDLFormatError as err:
                raise ClinicaDLFormatError(f"{err} (listed in {row.source}, line {row.line})") from None
        session = clinicadl.session_id(row.session) if row.session else ""
        return Scan(row.participant, row.subject, session, image, self.labels.index(row.diagnosis), source)

    def _scans(self, rows: Sequence[tuple[Row, Path | None]], what: str) -> list[Scan]:
        """The task's scans of ``rows``; bad ones raise or, with ``on_bad_file="skip"``, are listed in :attr:`skipped`."""
        scans, excluded = [], Counter()
        for row, image in rows:
            if row.diagnosis not in self.labels:
                excluded[row.diagnosis] += 1
                continue
            try:
                scans.append(self._scan(row, image))
            except (BadItemError, ClinicaDLFormatError) as err:
                if self.source.on_bad_file == "error":
                    raise
                self.skipped.append(str(err))
        if excluded:
            log.info("%s: dropped %s (diagnoses outside the task's %s)", what,
                     ", ".join(f"{n} {d}" for d, n in sorted(excluded.items())), ", ".join(self.labels))
        return scans

    def _inspected(self, scans: list[Scan]) -> tuple[list[Scan], dict[Path, str]]:
        """``scans`` whose image reads as a 3D volume (decoded once, checked, hashed; kept in ``cache_dir``)."""
        cache = InspectionCache(self.cache.dir)
        good, hashes = [], {}

        def inspect(scan: Scan) -> Any:
            try:
                return cache(scan.path)
            except BadItemError as err:
                return err

        for scan, result in zip(scans, in_threads(inspect, scans, self.cache.threads, "ADNI volumes checked")):
            if isinstance(result, BadItemError):
                if self.source.on_bad_file == "error":
                    raise BadItemError(f"{result} (listed in {scan.source})") from result
                self.skipped.append(str(result))
            else:
                good.append(scan)
                hashes[scan.path] = result.sha1
        cache.save()
        return good, hashes

    @staticmethod
    def baseline_of(scans: Sequence[Scan]) -> list[Scan]:
        """Each subject's first session (the session closest to ``ses-M000``); all scans where sessions are unknown."""
        if any(not s.session for s in scans):
            return list(scans)
        first: dict[str, Scan] = {}
        for scan in scans:
            if scan.subject not in first or clinicadl.session_month(scan.session) < clinicadl.session_month(first[scan.subject].session):
                first[scan.subject] = scan
        return [scan for scan in scans if first[scan.subject] is scan]

    def read_splits(self) -> dict[str, list[Scan]]:
        """The train, validation and test scans, checked (bad images, leakage, empty splits) and logged."""
        split, source = self.split, self.source
        self.skipped = []
        self.longitudinal = {"val": bool(split.valid_longitudinal), "test": bool(split.valid_longitudinal)}
        rows = self._rows()  # a split folder says what its validation and test subsets hold
        given = isinstance(rows, dict)
        listed = {split: self._scans(r, split) for split, r in rows.items()} if given else {"all": self._scans(rows, "cohort")}
        everything, hashes = self._inspected([scan for scans in listed.values() for scan in scans])
        kept = set(map(id, everything))
        listed = {split: [s for s in scans if id(s) in kept] for split, scans in listed.items()}
        if self.skipped:
            log.warning("skipped %d bad item(s) (on_bad_file='skip'):\n  %s", len(self.skipped), "\n  ".join(self.skipped))
        if not everything:
            raise ValueError(f"{source.tsv_path or source.csv_path}: no usable scans of {' vs '.join(self.labels)}")
        if given:
            splits = listed
            fractions = {"val": None, "test": None if splits["test"] else 0}
        else:
            train, val, test = split_subjects(listed["all"], split.val_fraction, split.test_fraction, self.hparams.seed,
                                              split.folds, split.fold or 0)
            splits = {"train": train, "val": val, "test": test}
            fractions = {"val": split.val_fraction, "test": None if split.folds else split.test_fraction}
        if split.baseline:
            splits["train"] = self.baseline_of(splits["train"])
        for name in ("val", "test"):
            if not self.longitudinal[name]:
                splits[name] = self.baseline_of(splits[name])
        if split.skip_leak_check:
            log.warning("split.skip_leak_check=true: the splits are not checked for shared subjects, sessions or images")
        else:
            check_leakage(splits, hashes)
        check_splits(splits, everything, fractions, self.labels)
        self.subject_codes = {subject: code for code, subject in enumerate(sorted({s.subject for s in everything}))}
        log.info(
            "ADNI %s: %s scans (train/val/test) of %s subjects%s%s",
            " vs ".join(self.labels), "/".join(str(len(splits[k])) for k in ("train", "val", "test")),
            "/".join(str(len({s.subject for s in splits[k]})) for k in ("train", "val", "test")),
            "; evaluated on baseline sessions" if not any(self.longitudinal.values()) else "",
            f"; {len(self.skipped)} bad item(s) skipped" if self.skipped else "",
        )
        return splits

    # ------------------------------------------------------------------ preprocessing and loaders
    def preprocessing(self, keep_meta: bool = False) -> Any:
        """The deterministic preprocessing of a ``{"image": path}`` item (:meth:`View.transform <lightning_hybrid.data.adni_settings.View.transform>`)."""
        return self.view.transform(keep_meta)

    def _preprocessed(self, scans: Sequence[Scan], split: str) -> Sequence[Any] | Dataset:
        """The split's items after the deterministic preprocessing, held as :attr:`cache` says."""
        from monai.data import Dataset as MonaiDataset, PersistentDataset

        data = [{"image": str(s.path), "label": s.label} for s in scans]
        if self.cache.dir is not None:  # keyed by the item and the preprocessing settings
            key = hashlib.md5(json.dumps(self.view.key()).encode()).hexdigest().encode()
            dataset = PersistentDataset(data, self.preprocessing(), cache_dir=self.cache.dir, hash_transform=lambda _: key)
        else:
            dataset = MonaiDataset(data, self.preprocessing())
        if self.cache.where in ("memory", "device", "auto"):
            return in_threads(dataset.__getitem__, range(len(dataset)), self.cache.threads, f"ADNI {split} preprocessed")
        return dataset

    def _dataset(self, scans: Sequence[Scan], split: str) -> Dataset:
        in_workers = split == "train" and self.augment.where == "workers"
        keys = None if split == "train" else [(i, self.subject_codes[s.subject]) for i, s in enumerate(scans)]
        return Volumes(self._preprocessed(scans, split), self.augment.per_sample() if in_workers else None, keys)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Training batches on the device: the random augmentation (``augment.where="device"``)."""
        if not (self.augment.where == "device" and self.trainer is not None and self.trainer.training):
            return batch
        if self._device_augment is None:  # each rank its own draws
            self._device_augment = self.augment.batched(seed=self.hparams.seed + 7919 * self.trainer.global_rank)
        images, labels = batch
        return self._device_augment(images), labels

    @property
    def device_cache(self) -> torch.device | None:
        """Where ``cache.where="device"`` (or ``"auto"`` resolved to it) holds the volumes, else None."""
        if self.cache.where not in ("device", "auto") or self.trainer is None or self.train_set is None:
            return None
        device = self.trainer.strategy.root_device
        if self.cache.where == "device":
            return device
        if device.type != "cuda" or self.augment.where == "workers":
            return None
        needed = sum(len(split) for split in (self.train_set, self.val_set, self.test_set)) * 4 * self.view.voxels
        free, _ = torch.cuda.mem_get_info(device)
        return device if needed <= free / 4 else None

    def _loader(self, dataset: Dataset | None, shuffle: bool) -> DataLoader:
        device = self.device_cache
        if device is None or dataset is None:
            return super()._loader(dataset, shuffle)
        if id(dataset) not in self._on_device:
            self._on_device[id(dataset)] = VolumesOn(dataset, device)
        on_device = self._on_device[id(dataset)]
        return DataLoader(
            on_device, batch_size=self.hparams.batch_size,
            sampler=EpochSeededRandomSampler(on_device, seed=self.hparams.seed) if shuffle else None,
            drop_last=shuffle and self.drop_last_train,
        )

    @property
    def loader_workers(self) -> int:
        """``num_workers``, with ``"auto"`` resolved on this machine."""
        hp = self.hparams
        if hp.num_workers != "auto":
            return int(hp.num_workers)
        if self.augment.where == "workers":
            processes = self.trainer.num_devices if self.trainer is not None else 1
            return max(1, min(8, (os.cpu_count() or 1) // max(processes, 1) - 1))
        return 2

    def build(self) -> tuple[Dataset, Dataset, Dataset]:
        self.splits = self.read_splits()
        return tuple(self._dataset(self.splits[split], split) for split in ("train", "val", "test"))


class PhantomADNIDataModule(ADNIDataModule):
    """:class:`ADNIDataModule` over synthetic volumes (:mod:`lightning_hybrid.data.adni_phantoms`), written
    into ``root`` first when its ``adni.csv`` is absent: the whole pipeline without ADNI access, in
    seconds (geometric shapes; :mod:`lightning_hybrid.data.adni_like` builds a cohort from real anatomy)."""

    def __init__(
        self, root: str | Path, subjects: int = 40, volume_shape: Sequence[int] = (64, 76, 64), synth_seed: int = 0,
        source: None = None, **kwargs: Any,
    ) -> None:
        from lightning_hybrid.data.adni_phantoms import write_adni_phantoms

        if source is not None:
            raise ValueError("PhantomADNIDataModule writes and reads root/adni.csv; set root, not source")
        csv_path = Path(root) / "adni.csv"
        if not csv_path.is_file():
            log.warning("writing %d SYNTHETIC subjects to %s (not ADNI data)", subjects, root)
            write_adni_phantoms(root, subjects=subjects, shape=tuple(volume_shape), seed=synth_seed)
        super().__init__(Source(csv_path=csv_path), **kwargs)
        self.save_hyperparameters({"root": str(root), "subjects": subjects, "volume_shape": [int(s) for s in volume_shape],
                                   "synth_seed": synth_seed}, logger=False)
