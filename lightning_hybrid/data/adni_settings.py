"""The settings of :class:`~lightning_hybrid.data.ADNIDataModule`, in the groups a user sets them:
where the scans come from (:class:`Source`), how they are split and evaluated (:class:`Split`), the
preprocessed view of each volume (:class:`View`), the training augmentation (:class:`Augment`) and where
preprocessed volumes are held (:class:`Cache`). ClinicaDL groups its own options alike (its data,
split, transforms and computational configs); under Hydra each group is a key of ``data``
(``data.view.spacing=[2,2,2]``, ``data.split.fold=3``).

Plain values only (no Lightning, no MONAI at import): each group checks its values when made, is
made from a mapping (a Hydra group) with :func:`settings`, and is written into checkpoints as a dict
(:func:`dataclasses.asdict`) that checkpoints read with ``weights_only=True`` accept.

Example::

    >>> View(image_shape=[64, 64, 64], spacing=2).spacing
    (2.0, 2.0, 2.0)
    >>> settings(Augment, {"where": False}).where is None
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

#: Where preprocessed volumes are held (:attr:`Cache.where`).
CACHES = ("auto", "device", "memory", "disk", None)
#: Where the training augmentation runs (:attr:`Augment.where`); None: no augmentation.
AUGMENT_WHERE = ("device", "workers", None)
#: Part of the disk cache's keys: raise it when :meth:`View.transform` changes.
PREPROCESSING_VERSION = 2

Group = TypeVar("Group")

#: The datamodule's arguments before they were grouped, and the ``group.field`` each is now.
FLAT_NAMES = {
    **{name: f"source.{name}" for name in ("csv_path", "root", "caps_directory", "tsv_path", "labels_tsv", "on_bad_file",
                                           "use_uncropped_image")},
    "split": "split.fold",
    **{name: f"split.{name}" for name in ("fold", "folds", "val_fraction", "test_fraction", "baseline",
                                          "valid_longitudinal", "skip_leak_check")},
    **{name: f"view.{name}" for name in ("image_shape", "spacing", "downsample")},
    "augment_on": "augment.where", "cache": "cache.where", "cache_dir": "cache.dir", "preprocess_threads": "cache.threads",
}


def _set(group: Any, name: str, value: Any) -> None:
    object.__setattr__(group, name, value)  # the groups are frozen; their checks normalise once


def _path(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class Source:
    """Where the scans and their diagnoses are read: ClinicaDL's outputs or a CSV (one of the two).

    Args:
        caps_directory: ClinicaDL's CAPS folder (``subjects/`` inside, t1-linear images).
        tsv_path: a ClinicaDL TSV (split here by subject) or a split folder of ``clinicadl tsvtools``.
        labels_tsv: the diagnoses of split TSVs that have none (ClinicaDL 2.0's); None: a ``labels.tsv``
            up to four folders above the split, where ClinicaDL's tsvtools look.
        use_uncropped_image: t1-linear's uncropped image instead of the cropped one.
        csv_path: a CSV of a subject, an image path and a diagnosis per row (and optionally a session).
        root: the folder the CSV's image paths are relative to (None: the CSV's folder).
        on_bad_file: ``"error"`` stops at a bad image or row, naming it; ``"skip"`` counts and lists them.
    """

    caps_directory: str | None = None
    tsv_path: str | None = None
    labels_tsv: str | None = None
    use_uncropped_image: bool = False
    csv_path: str | None = None
    root: str | None = None
    on_bad_file: str = "error"

    def __post_init__(self) -> None:
        for name in ("caps_directory", "tsv_path", "labels_tsv", "csv_path", "root"):
            _set(self, name, _path(getattr(self, name)))
        if (self.csv_path is None) == (self.caps_directory is None):
            raise ValueError("give either source.csv_path (a CSV of images) or source.caps_directory and "
                             f"source.tsv_path (ClinicaDL's outputs); got csv_path={self.csv_path!r}, "
                             f"caps_directory={self.caps_directory!r}")
        if self.caps_directory is not None and self.tsv_path is None:
            raise ValueError("source.caps_directory needs source.tsv_path: a ClinicaDL TSV or split folder "
                             "(clinicadl tsvtools)")
        if self.on_bad_file not in ("error", "skip"):
            raise ValueError(f"source.on_bad_file must be 'error' or 'skip', got {self.on_bad_file!r}")

    def check_exists(self) -> None:
        """Raise FileNotFoundError, saying how to make it, where a file or folder named here is missing."""
        made = "an ADNI-like one: lightning-hybrid data make-adni-like OUT"
        if self.caps_directory is not None:
            if not (Path(self.caps_directory) / "subjects").is_dir():
                raise FileNotFoundError(f"{self.caps_directory} is not a CAPS folder (no subjects/ in it); {made}")
            if not Path(self.tsv_path).exists():
                raise FileNotFoundError(f"source.tsv_path {self.tsv_path}: no such TSV file or split folder")
        elif not Path(self.csv_path).is_file():
            raise FileNotFoundError(f"ADNI CSV {self.csv_path} not found (ClinicaDL's outputs: source.caps_directory "
                                    f"and source.tsv_path; {made})")


@dataclass(frozen=True)
class Split:
    """How the cohort is split into training, validation and test scans, and which sessions count.

    Args:
        fold: which fold: of a ClinicaDL k-fold split folder (ClinicaDL's ``--split``; None: the single
            split) or of the k-fold made here with ``folds`` (None: fold 0).
        folds: the number of folds: of the k-fold to read in a ClinicaDL split folder (its ``--n_splits``:
            needed to pick a fold where a single split lies beside the k-fold), or of a stratified k-fold
            over subjects made here (a CSV or a single TSV); None: one split by ``val_fraction`` and
            ``test_fraction``.
        val_fraction, test_fraction: shares of the subjects held out when splitting here (per class).
        baseline: train on each subject's baseline session only.
        valid_longitudinal: validate and test on every session (True) or on baseline sessions (False, as the
            field reports); None: as a ClinicaDL 2.0 split folder records it, else baseline sessions.
        skip_leak_check: do not refuse splits that share subjects, sessions or images (said in the log).
    """

    fold: int | None = None
    folds: int | None = None
    val_fraction: float = 0.15
    test_fraction: float = 0.15
    baseline: bool = False
    valid_longitudinal: bool | None = None
    skip_leak_check: bool = False

    def __post_init__(self) -> None:
        if self.fold is not None:
            _set(self, "fold", int(self.fold))
        if self.folds is not None and not 0 <= (self.fold or 0) < self.folds:
            raise ValueError(f"split.fold must be in [0, {self.folds}) with split.folds={self.folds}, got {self.fold}")
        for name in ("val_fraction", "test_fraction"):
            if not 0.0 <= float(getattr(self, name)) < 1.0:
                raise ValueError(f"split.{name} must be in [0, 1), got {getattr(self, name)}")
            _set(self, name, float(getattr(self, name)))


@dataclass(frozen=True)
class View:
    """The deterministic preprocessing: canonical (RAS) orientation, resampling to ``spacing`` mm,
    intensity normalisation over the non-zero voxels, crop or pad to ``image_shape`` about the centre,
    then optional downsampling by an integer factor.

    The default, 112 x 136 x 120 voxels of 1.5 mm, holds a whole brain (t1-linear's cropped field of
    view is 169 x 208 x 179 mm).
    """

    image_shape: Sequence[int] = (112, 136, 120)
    spacing: Sequence[float] | float = (1.5, 1.5, 1.5)
    downsample: int = 1

    def __post_init__(self) -> None:
        spacing = [self.spacing] * 3 if isinstance(self.spacing, (int, float)) else list(self.spacing)
        _set(self, "image_shape", tuple(int(s) for s in self.image_shape))
        _set(self, "spacing", tuple(float(s) for s in spacing))
        _set(self, "downsample", int(self.downsample))
        if len(self.image_shape) != 3 or len(self.spacing) != 3:
            raise ValueError(f"view.image_shape and view.spacing need 3 values, got {list(self.image_shape)} "
                             f"and {list(self.spacing)}")
        if self.downsample < 1 or any(s % self.downsample for s in self.image_shape):
            raise ValueError(f"view.image_shape must be 3 sizes divisible by view.downsample={self.downsample}, "
                             f"got {list(self.image_shape)}")

    @property
    def shape(self) -> tuple[int, int, int]:
        """The volume's shape after downsampling: what the network sees."""
        return tuple(s // self.downsample for s in self.image_shape)  # type: ignore[return-value]

    @property
    def voxels(self) -> int:
        return math.prod(self.shape)

    @property
    def voxel_mm(self) -> float:
        """The coarsest voxel edge of what the network sees, in mm."""
        return max(self.spacing) * self.downsample

    def key(self) -> list[Any]:
        """What a preprocessed volume depends on besides its file: the disk cache's key."""
        return [PREPROCESSING_VERSION, list(self.spacing), list(self.image_shape), self.downsample]

    def transform(self, keep_meta: bool = False) -> Any:
        """The preprocessing of a ``{"image": path}`` item (MONAI dictionary transforms); ``keep_meta``
        keeps the affine on the returned MetaTensor."""
        from monai import transforms as T

        from lightning_hybrid.data.volume_files import LoadVolumed

        steps = [
            LoadVolumed(keys="image"),
            T.Orientationd(keys="image", axcodes="RAS", labels=(("L", "R"), ("P", "A"), ("I", "S"))),
            T.Spacingd(keys="image", pixdim=self.spacing, mode="bilinear"),
            T.NormalizeIntensityd(keys="image", nonzero=True, channel_wise=True),
            T.ResizeWithPadOrCropd(keys="image", spatial_size=self.image_shape),
        ]
        if self.downsample > 1:
            steps.append(T.Resized(keys="image", spatial_size=self.shape))
        steps.append(T.EnsureTyped(keys="image", track_meta=keep_meta))
        return T.Compose(steps)


@dataclass(frozen=True)
class Augment:
    """The random training augmentation: a flip along the first spatial axis, a small affine transform
    (rotation of ``+-rotate`` radians about each axis, scale ``1 +- scale``) and Gaussian noise, each
    drawn per sample with its probability.

    ``where="device"`` applies it to each batch on the training device (a few batched tensor operations,
    :class:`~lightning_hybrid.data.volume_augment.VolumeAugment`); ``"workers"`` per sample in the
    DataLoader's workers (MONAI's random transforms, the same draws' family); None (or false) not at all.
    """

    where: str | None = "device"
    flip_prob: float = 0.5
    affine_prob: float = 0.5
    rotate: float = 0.05
    scale: float = 0.05
    noise_prob: float = 0.2
    noise_std: float = 0.05

    def __post_init__(self) -> None:
        where = {False: None, True: "device"}[self.where] if isinstance(self.where, bool) else self.where
        if where not in AUGMENT_WHERE:
            raise ValueError(f"augment.where must be one of {', '.join(map(repr, AUGMENT_WHERE))} (false: none), "
                             f"got {self.where!r}")
        _set(self, "where", where)

    def batched(self, seed: int) -> Any:
        """The augmentation of whole batches on their device (``where="device"``)."""
        from lightning_hybrid.data.volume_augment import VolumeAugment

        return VolumeAugment(self.flip_prob, 0, self.affine_prob, self.rotate, self.scale, self.noise_prob,
                             self.noise_std, seed=seed)

    def per_sample(self) -> Any:
        """The augmentation of one ``{"image": ...}`` item in a loader worker (``where="workers"``)."""
        from monai import transforms as T

        turn, zoom = (self.rotate,) * 3, (self.scale,) * 3
        return T.Compose([
            T.RandFlipd(keys="image", prob=self.flip_prob, spatial_axis=0),
            T.RandAffined(keys="image", prob=self.affine_prob, rotate_range=turn, scale_range=zoom),
            T.RandGaussianNoised(keys="image", prob=self.noise_prob, std=self.noise_std),
        ])


@dataclass(frozen=True)
class Cache:
    """Where the preprocessed volumes are held.

    Args:
        where: ``"memory"`` (built at setup), ``"device"`` (moved once more, to the training device, where
            batches are gathered without loader workers or copies: ``4 x voxels`` bytes per scan),
            ``"auto"`` (``"device"`` on a CUDA device when the three splits take at most a quarter of
            its free memory and augmentation runs there, else ``"memory"``), ``"disk"`` (read from
            ``dir`` at every access) or None (preprocessed at every access).
        dir: where preprocessed volumes, and the volumes' checks and hashes, persist between runs
            (MONAI's ``PersistentDataset``, keyed by the file and the :class:`View`); None: not kept.
        threads: volumes checked and preprocessed at once at setup.
    """

    where: str | None = "auto"
    dir: str | None = None
    threads: int = 4

    def __post_init__(self) -> None:
        _set(self, "dir", _path(self.dir))
        if self.where not in CACHES:
            raise ValueError(f"cache.where must be one of {', '.join(map(repr, CACHES))}, got {self.where!r}")
        if self.where == "disk" and self.dir is None:
            raise ValueError("cache.where=disk needs a cache.dir")
        if int(self.threads) < 1:
            raise ValueError(f"cache.threads must be at least 1, got {self.threads}")
        _set(self, "threads", int(self.threads))


#: The groups whose None means "off" (Python's None, Hydra's null): no cache, no augmentation.
OFF = {"Cache": {"where": None}, "Augment": {"where": None}}


def _an(name: str) -> str:
    return f"an {name}" if name[0] in "AEIOU" else f"a {name}"


def settings(group: type[Group], value: Group | Mapping[str, Any] | None) -> Group:
    """``value`` as the settings ``group``: itself, or made from a mapping (a Hydra group, a checkpoint's dict).
    None is "off" where a group can be off (``cache``, ``augment``: nothing cached, no augmentation) and refused
    elsewhere; a key of another group is refused naming the group it belongs to, an unknown key naming the
    group's keys."""
    name = group.__name__
    key = name.lower()
    if value is None:
        if name in OFF:
            return group(**OFF[name])
        raise TypeError(f"{key}=None: {key} cannot be off; leave it out for its defaults, or give {_an(name)} or a "
                        f"mapping of its fields (data.{key}.<field>=... on the command line)")
    if isinstance(value, group):
        return value
    if not isinstance(value, Mapping):
        first = fields(group)[0].name  # type: ignore[arg-type]
        raise TypeError(f"{key} must be {_an(name)} or a mapping of its fields, e.g. {key}={{{first!r}: {value!r}}}, "
                        f"got {value!r}")
    names = [f.name for f in fields(group)]  # type: ignore[arg-type]
    unknown = sorted(set(value) - set(names))
    elsewhere = {k: FLAT_NAMES[k].split(".")[0] for k in unknown if k in FLAT_NAMES and FLAT_NAMES[k].split(".")[0] != key}
    if elsewhere:
        moves = ", ".join(f"{k!r} belongs to {g} ({g}={{{FLAT_NAMES[k].split('.')[1]!r}: ...}})" for k, g in elsewhere.items())
        raise TypeError(f"{key} has no {', '.join(map(repr, elsewhere))}: {moves}")
    if unknown:
        raise TypeError(f"{key} has no {', '.join(map(repr, unknown))}; its settings are {', '.join(names)}")
    return group(**{str(k): v for k, v in value.items()})


def moved_keywords(given: Mapping[str, Any]) -> str:
    """What an old flat keyword of the datamodule is now (``caps_directory=... -> source={'caps_directory': ...}``),
    for each of ``given``, one per line; empty when none of them is an old keyword."""
    lines = []
    for name, value in given.items():
        if name in FLAT_NAMES:
            group, field = FLAT_NAMES[name].split(".")
            lines.append(f"{name}={value!r} -> {group}={{{field!r}: {value!r}}}")
    return "\n".join(lines)


def group_flat_arguments(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The datamodule's arguments as written before they were grouped (an older run's saved config) in groups;
    arguments already grouped, and the plain ones (task, batch size, loader), are kept as they are.

    Of the two old fold numbers the one that applied is kept: ClinicaDL's ``split`` for a CAPS folder, the CSV
    k-fold's ``fold`` with ``folds``; a source left unset (None) stays unset, and ``root`` without ``csv_path``
    is the synthetic datamodule's own folder, not the CSV's."""
    skip = {"augment", "augment_on"} | {name for name in FLAT_NAMES if flat.get(name) is None and name.endswith(
        ("_path", "_directory", "_tsv"))}
    skip |= {"fold"} if not flat.get("folds") else set()
    skip |= {"split"} if flat.get("caps_directory") is None else set()
    own_root = flat.get("csv_path") is None  # then ``root`` is no CSV's: the synthetic datamodule's folder, or unset
    grouped: dict[str, Any] = {}
    for name, value in flat.items():
        if name == "root" and own_root:
            if value is not None:
                grouped[name] = value
        elif isinstance(value, Mapping) or name not in FLAT_NAMES:
            grouped[name] = value
        elif name not in skip:
            group, field = FLAT_NAMES[name].split(".")
            grouped.setdefault(group, {})[field] = value
    if "augment" in flat and not isinstance(flat["augment"], Mapping):
        grouped["augment"] = {"where": flat.get("augment_on", "device") if flat["augment"] else None}
    return grouped
