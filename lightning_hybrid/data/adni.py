"""ADNI structural MRI for AD vs NC and pMCI vs sMCI, preprocessed with MONAI, split by subject."""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import torch
from torch.utils.data import Dataset

from lightning_hybrid.data.base import InMemoryDataModule
from lightning_hybrid.data.volume_augment import VolumeAugment

log = logging.getLogger(__name__)

#: Column names accepted for each field (case-insensitive): ADNI's usual spellings.
COLUMNS = {
    "subject_id": ("subject_id", "subject", "ptid", "rid", "subject id"),
    "image": ("image", "path", "file", "filename", "image_path", "image path"),
    "diagnosis": ("diagnosis", "dx", "dx_bl", "group", "research group", "label"),
}
#: Diagnosis spellings to the canonical labels.
DIAGNOSES = {
    "ad": "AD", "dementia": "AD", "alzheimer's disease": "AD",
    "nc": "NC", "cn": "NC", "normal": "NC", "control": "NC",
    "smci": "sMCI", "stable mci": "sMCI", "pmci": "pMCI", "progressive mci": "pMCI",
    "mci": "MCI", "emci": "MCI", "lmci": "MCI",
}
#: Part of the disk cache's keys: raise it when :meth:`ADNIDataModule.preprocessing` changes.
PREPROCESSING_VERSION = 1
#: Task: (label 0, label 1).
TASKS = {"AD_vs_NC": ("NC", "AD"), "pMCI_vs_sMCI": ("sMCI", "pMCI")}


class BadItemError(ValueError):
    """A CSV row or an image file the datamodule cannot use; the message names it."""


@dataclass
class Scan:
    subject: str
    path: Path
    label: int
    row: int


def _column(header: Sequence[str], field: str, csv_path: Path) -> str:
    lowered = {h.strip().lower(): h for h in header}
    for alias in COLUMNS[field]:
        if alias in lowered:
            return lowered[alias]
    raise BadItemError(
        f"{csv_path}: no {field!r} column (accepted names: {', '.join(COLUMNS[field])}); columns are {list(header)}"
    )


def check_volume(path: Path) -> None:
    """Raise BadItemError naming ``path`` unless it is a readable 3D NIfTI volume."""
    if not path.is_file():
        raise BadItemError(f"{path}: no such file")
    try:
        image = nib.load(path)
        shape = image.shape
        np.asanyarray(image.dataobj)  # decode it all: truncated files fail here
    except Exception as err:  # nibabel raises many types for damaged files
        raise BadItemError(f"{path}: not a readable NIfTI volume ({type(err).__name__}: {err})") from err
    if len(shape) != 3:
        raise BadItemError(f"{path}: a {len(shape)}D image of shape {shape}; a 3D structural volume is needed")


def read_scans(csv_path: Path, root: Path | None, task: str, on_bad_file: str) -> tuple[list[Scan], list[str]]:
    """The task's scans from the CSV, and what was skipped (with ``on_bad_file="skip"``)."""
    negative, positive = TASKS[task]
    scans, skipped, excluded = [], [], Counter()
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        columns = {field: _column(header, field, csv_path) for field in COLUMNS}
        for number, row in enumerate(reader, start=2):  # line 1 is the header
            try:
                raw = (row[columns["diagnosis"]] or "").strip()
                diagnosis = DIAGNOSES.get(raw.lower())
                if diagnosis is None:
                    raise BadItemError(
                        f"{csv_path}, line {number}: unknown diagnosis {raw!r} (known: AD, NC/CN, sMCI, pMCI, MCI "
                        "and ADNI's spellings)"
                    )
                if diagnosis not in (negative, positive):
                    excluded[diagnosis] += 1
                    continue
                image = Path(row[columns["image"]].strip())
                if not image.is_absolute():
                    image = (root or csv_path.parent) / image
                check_volume(image)
                subject = row[columns["subject_id"]].strip()
                scans.append(Scan(subject, image, int(diagnosis == positive), number))
            except BadItemError as err:
                if on_bad_file == "error":
                    raise
                skipped.append(str(err))
    if excluded:
        log.info("%s: %s not part of task %s", csv_path, dict(excluded), task)
    if skipped:
        log.warning("skipped %d bad item(s) (on_bad_file='skip'):\n  %s", len(skipped), "\n  ".join(skipped))
    return scans, skipped


def split_subjects(
    scans: Sequence[Scan], val_fraction: float, test_fraction: float, seed: int, folds: int | None, fold: int
) -> tuple[list[Scan], list[Scan], list[Scan]]:
    """Train, validation and test scans; a subject's scans stay together; stratified per class, seeded.

    With ``folds``, the test split is fold ``fold`` of a stratified k-fold over subjects, and the
    validation split ``val_fraction`` of the rest.
    """
    by_subject: dict[str, list[Scan]] = defaultdict(list)
    for scan in scans:
        by_subject[scan.subject].append(scan)
    by_class: dict[int, list[str]] = defaultdict(list)
    for subject, subject_scans in sorted(by_subject.items()):
        label = Counter(s.label for s in subject_scans).most_common(1)[0][0]
        by_class[label].append(subject)
    rng = np.random.default_rng(seed)
    train, val, test = [], [], []
    for label in sorted(by_class):
        subjects = list(by_class[label])
        rng.shuffle(subjects)
        n = len(subjects)
        if folds:
            test_part = subjects[fold::folds]
            rest = [s for s in subjects if s not in set(test_part)]
        else:
            n_test = int(round(n * test_fraction))
            test_part, rest = subjects[:n_test], subjects[n_test:]
        n_val = int(round(len(rest) * val_fraction / (1 - (0 if folds else test_fraction))))
        test += test_part
        val += rest[:n_val]
        train += rest[n_val:]
    pick = lambda names: [scan for name in names for scan in by_subject[name]]  # noqa: E731
    return pick(train), pick(val), pick(test)


def check_splits(
    splits: dict[str, Sequence[Scan]], scans: Sequence[Scan], fractions: dict[str, float | None], task: str
) -> None:
    """Raise a ValueError naming the cohort's numbers when a split asked for (fraction > 0, or a
    cross-validation fold: ``None``) came out empty: its metrics would silently be missing."""
    for split, fraction in fractions.items():
        if splits[split] or fraction == 0:
            continue
        negative, positive = TASKS[task]
        subjects = {label: len({s.subject for s in scans if s.label == label}) for label in (0, 1)}
        asked = f"data.{split}_fraction={fraction}" if fraction is not None else "the cross-validation fold"
        raise ValueError(
            f"ADNI {task}: the {split} split is empty. The cohort has {len({s.subject for s in scans})} subjects "
            f"({subjects[1]} {positive}, {subjects[0]} {negative}; {len(scans)} scans) and {asked} rounds to 0 subjects "
            f"per class (splits are by subject, stratified by class). Use a larger cohort (more subjects per class), "
            f"raise data.{split}_fraction, or set data.{split}_fraction=0 to go without a {split} set."
        )


class _Volumes(Dataset):
    """Preprocessed volumes as ``(image, label)`` pairs of plain tensors, optionally through a random
    augmentation (run in the DataLoader's workers)."""

    def __init__(self, preprocessed: Sequence[Any] | Dataset, augmentation: Any = None) -> None:
        self.preprocessed, self.augmentation = preprocessed, augmentation

    def __len__(self) -> int:
        return len(self.preprocessed)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        item = self.preprocessed[index]
        if self.augmentation is not None:
            item = self.augmentation(dict(item))
        return torch.as_tensor(item["image"]).float(), torch.tensor(item["label"], dtype=torch.long)


def preprocess_all(dataset: Dataset, threads: int, what: str) -> list[Any]:
    """Every item of ``dataset`` (its deterministic preprocessing, done or read from the disk cache),
    ``threads`` at a time, logging progress."""
    total, done, items = len(dataset), 0, [None] * len(dataset)
    start = time.perf_counter()
    every = max(1, total // 10)
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for index, item in zip(range(total), pool.map(dataset.__getitem__, range(total))):
            items[index] = item
            done += 1
            if done % every == 0 or done == total:
                elapsed = time.perf_counter() - start
                log.info("%s: %d/%d volumes preprocessed (%.1f/s)", what, done, total, done / max(elapsed, 1e-9))
    return items


class ADNIDataModule(InMemoryDataModule):
    """Structural MRI (NIfTI) listed in a CSV, for ``task="AD_vs_NC"`` or ``"pMCI_vs_sMCI"``.

    The CSV needs a subject, an image path (relative to the CSV's folder or ``root``, or absolute)
    and a diagnosis column; ADNI's usual column names and diagnosis spellings are accepted. Scans
    are split by subject (all of a subject's scans in one split), stratified by class and seeded,
    optionally as a k-fold. Preprocessing with MONAI: canonical (RAS) orientation, resampling to
    ``spacing`` mm, intensity normalization over the non-zero voxels, crop or pad to
    ``image_shape``, optional downsampling by an integer factor.

    Feeding a GPU: the deterministic preprocessing runs once per volume. ``cache="memory"`` holds
    the preprocessed volumes in memory (built at setup, ``preprocess_threads`` at a time),
    ``"disk"`` reads them from ``cache_dir`` at every access, ``None`` preprocesses at every
    access. With ``cache_dir`` set they also persist there between runs (MONAI's
    ``PersistentDataset``, keyed by the file and the preprocessing settings), so a later run, or
    another process of this one, reads instead of preprocessing. Training augmentation (random
    flips, small affine transforms, Gaussian noise) runs on the batch after it reached the training
    device (``augment_on="device"``: :class:`~lightning_hybrid.data.volume_augment.VolumeAugment`,
    a few batched tensor operations) or per sample in the DataLoader's workers
    (``augment_on="workers"``, MONAI's random transforms). Loaders use ``num_workers`` worker
    processes (``"auto"``: 2 when augmenting on the device, else up to 8 within this process's
    share of the cores), kept alive between epochs, pinned memory when CUDA is present
    (``pin_memory="auto"``; Lightning then copies batches to the GPU without blocking) and
    ``prefetch_factor`` batches in flight per worker.

    A missing, corrupt, truncated, 2D or 4D image, an unknown diagnosis or a missing column raise
    an error naming the file or CSV line; with ``on_bad_file="skip"`` bad rows are skipped, counted
    and listed in the log.

    Example::

        >>> # lightning-hybrid data synth-adni --out synth --subjects 40
        >>> dm = ADNIDataModule("synth/adni.csv", image_shape=(64, 64, 64), batch_size=4)  # doctest: +SKIP
    """

    num_classes = 2
    drop_last_train = True  # small 3D batches and BatchNorm: never a training batch of one

    def __init__(
        self,
        csv_path: str | Path,
        root: str | Path | None = None,
        task: str = "AD_vs_NC",
        image_shape: Sequence[int] = (96, 112, 96),
        batch_size: int = 6,
        seed: int = 0,
        on_bad_file: str = "error",
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        folds: int | None = None,
        fold: int = 0,
        spacing: Sequence[float] = (1.5, 1.5, 1.5),
        downsample: int = 1,
        augment: bool = True,
        augment_on: str = "device",
        cache: str | None = "memory",
        cache_dir: str | Path | None = None,
        num_workers: int | str = "auto",
        pin_memory: bool | str = "auto",
        prefetch_factor: int = 4,
        preprocess_threads: int = 4,
    ) -> None:
        super().__init__()
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; choose one of {sorted(TASKS)}")
        if on_bad_file not in ("error", "skip"):
            raise ValueError(f"on_bad_file must be 'error' or 'skip', got {on_bad_file!r}")
        if len(image_shape) != 3 or downsample < 1 or any(int(s) % downsample for s in image_shape):
            raise ValueError(f"image_shape must be 3 sizes divisible by downsample={downsample}, got {list(image_shape)}")
        if folds is not None and not 0 <= fold < folds:
            raise ValueError(f"fold must be in [0, {folds}), got {fold}")
        if cache not in ("memory", "disk", None):
            raise ValueError(f"cache must be 'memory', 'disk' or None, got {cache!r}")
        if cache == "disk" and cache_dir is None:
            raise ValueError("cache='disk' needs a cache_dir")
        if augment_on not in ("device", "workers"):
            raise ValueError(f"augment_on must be 'device' or 'workers', got {augment_on!r}")
        if not (num_workers == "auto" or (isinstance(num_workers, int) and num_workers >= 0)):
            raise ValueError(f"num_workers must be 'auto' or a non-negative integer, got {num_workers!r}")
        if not Path(csv_path).is_file():
            raise FileNotFoundError(f"ADNI CSV {csv_path} not found (synthetic stand-in: lightning-hybrid data synth-adni)")
        # plain values only: the hyperparameters go into checkpoints read with weights_only=True
        image_shape, spacing = [int(s) for s in image_shape], [float(s) for s in spacing]
        csv_path, root = str(csv_path), None if root is None else str(root)
        cache_dir = None if cache_dir is None else str(cache_dir)
        self.save_hyperparameters(logger=False)
        self.skipped: list[str] = []
        self._device_augment: VolumeAugment | None = None

    def preprocessing(self, keep_meta: bool = False) -> Any:
        """The deterministic preprocessing of a ``{"image": path}`` item (MONAI dictionary transforms)."""
        from monai import transforms as T

        hp = self.hparams
        steps = [
            T.LoadImaged(keys="image", image_only=True),
            T.EnsureChannelFirstd(keys="image"),
            T.Orientationd(keys="image", axcodes="RAS"),
            T.Spacingd(keys="image", pixdim=hp.spacing, mode="bilinear"),
            T.NormalizeIntensityd(keys="image", nonzero=True, channel_wise=True),
            T.ResizeWithPadOrCropd(keys="image", spatial_size=hp.image_shape),
        ]
        if hp.downsample > 1:
            steps.append(T.Resized(keys="image", spatial_size=[s // hp.downsample for s in hp.image_shape]))
        steps.append(T.EnsureTyped(keys="image", track_meta=keep_meta))
        return T.Compose(steps)

    def _worker_augmentation(self) -> Any:
        from monai import transforms as T

        return T.Compose([
            T.RandFlipd(keys="image", prob=0.5, spatial_axis=0),
            T.RandAffined(keys="image", prob=0.5, rotate_range=(0.05, 0.05, 0.05), scale_range=(0.05, 0.05, 0.05)),
            T.RandGaussianNoised(keys="image", prob=0.2, std=0.05),
        ])

    def _preprocessed(self, scans: Sequence[Scan], split: str) -> Sequence[Any] | Dataset:
        """The split's items after the deterministic preprocessing, held as ``cache`` says."""
        from monai.data import Dataset as MonaiDataset, PersistentDataset

        hp = self.hparams
        data = [{"image": str(s.path), "label": s.label} for s in scans]
        if hp.cache_dir is not None:  # keyed by the item and the preprocessing settings
            settings = json.dumps([PREPROCESSING_VERSION, hp.spacing, hp.image_shape, hp.downsample]).encode()
            dataset = PersistentDataset(data, self.preprocessing(), cache_dir=hp.cache_dir,
                                        hash_transform=lambda _: hashlib.md5(settings).hexdigest().encode())
        else:
            dataset = MonaiDataset(data, self.preprocessing())
        if hp.cache == "memory":
            return preprocess_all(dataset, hp.preprocess_threads, f"ADNI {split}")
        return dataset

    def _dataset(self, scans: Sequence[Scan], split: str) -> Dataset:
        hp = self.hparams
        in_workers = split == "train" and hp.augment and hp.augment_on == "workers"
        return _Volumes(self._preprocessed(scans, split), self._worker_augmentation() if in_workers else None)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Training batches on the device: the random augmentation (``augment_on="device"``)."""
        hp = self.hparams
        if not (hp.augment and hp.augment_on == "device" and self.trainer is not None and self.trainer.training):
            return batch
        if self._device_augment is None:  # each rank its own draws
            self._device_augment = VolumeAugment(seed=hp.seed + 7919 * self.trainer.global_rank)
        images, labels = batch
        return self._device_augment(images), labels

    @property
    def loader_workers(self) -> int:
        """``num_workers``, with ``"auto"`` resolved on this machine."""
        hp = self.hparams
        if hp.num_workers != "auto":
            return int(hp.num_workers)
        if hp.augment and hp.augment_on == "workers":
            processes = self.trainer.num_devices if self.trainer is not None else 1
            return max(1, min(8, (os.cpu_count() or 1) // max(processes, 1) - 1))
        return 2

    def build(self) -> tuple[Dataset, Dataset, Dataset]:
        hp = self.hparams
        scans, self.skipped = read_scans(Path(hp.csv_path), Path(hp.root) if hp.root else None, hp.task, hp.on_bad_file)
        if not scans:
            raise ValueError(f"{hp.csv_path}: no usable scans for task {hp.task}")
        train, val, test = split_subjects(scans, hp.val_fraction, hp.test_fraction, hp.seed, hp.folds, hp.fold)
        self.splits = {"train": train, "val": val, "test": test}
        check_splits(self.splits, scans, {"val": hp.val_fraction, "test": None if hp.folds else hp.test_fraction}, hp.task)
        log.info(
            "ADNI %s: %d/%d/%d scans (train/val/test) of %d subjects%s",
            hp.task, len(train), len(val), len(test), len({s.subject for s in scans}),
            f"; {len(self.skipped)} bad item(s) skipped" if self.skipped else "",
        )
        return self._dataset(train, "train"), self._dataset(val, "val"), self._dataset(test, "test")


class SyntheticADNIDataModule(ADNIDataModule):
    """:class:`ADNIDataModule` over synthetic volumes (:mod:`lightning_hybrid.data.synth_adni`), written
    into ``root`` first when its ``adni.csv`` is absent: the whole pipeline without ADNI access."""

    def __init__(
        self, root: str | Path, subjects: int = 40, volume_shape: Sequence[int] = (64, 76, 64), synth_seed: int = 0,
        csv_path: None = None, **kwargs: Any,
    ) -> None:
        from lightning_hybrid.data.synth_adni import write_synthetic_adni

        if csv_path is not None:
            raise ValueError("SyntheticADNIDataModule writes and reads root/adni.csv; set root, not csv_path")
        csv_path = str(Path(root) / "adni.csv")
        if not Path(csv_path).is_file():
            log.warning("writing %d SYNTHETIC subjects to %s (not ADNI data)", subjects, root)
            write_synthetic_adni(root, subjects=subjects, shape=tuple(volume_shape), seed=synth_seed)
        super().__init__(csv_path, root=None, **kwargs)
