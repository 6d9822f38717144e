# Generated from lightning_hybrid/data/adni_like.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""An ADNI-like cohort built from real anatomy, written as ClinicaDL's outputs (CAPS, TSVs, split folders).

Real ADNI needs an account and a data use agreement; this benchmark does not. Every subject starts
from Colin27 (a real 1 mm T1-weighted head, skull included, in MNI space) with the AAL atlas's
hippocampi, both shipped by Debian's ``mricron-data``, and is then made a subject of its own:

1. **Atrophy** (in template space): a smooth displacement field that moves the hippocampi's
   boundary inwards by ``hippocampus_mm x severity`` and the lateral ventricles' outwards by
   ``ventricles_mm x severity``: what Alzheimer's disease does to the medial temporal lobe and the
   ventricles. Severity is drawn per subject from its diagnosis's normal distribution
   (:data:`SEVERITY`), so the classes overlap as real cohorts do; a follow-up session adds a year's
   progression. Progressive and stable MCI (``pMCI``, ``sMCI``: ClinicaDL's labels) are milder and
   partly present: their ventricles show half their severity (:data:`VENTRICLES_SHARE`).
2. **Anatomy** (per subject): a smooth random deformation (Gaussian-smoothed random offsets, as
   MONAI's ``Rand3DElastic`` draws them, on a coarse grid) and, per session, a small affine
   transform (what remains after t1-linear's affine registration).
3. **Scanner** (per session): a multiplicative bias field (MONAI's ``RandBiasField``), a gain, and
   Rician noise (MONAI's ``RandRicianNoise``).

The three deformations are composed into one sampling grid, so each image is interpolated once.
Each session is written where ``clinica run t1-linear`` writes it (169 x 208 x 179 voxels of 1 mm
in MNI152NLin2009cSym's cropped grid), with its **atrophy mask** beside it (the region the atrophy
field moves, carried through the subject's own deformation: the ground truth an explanation is
scored against) and its brain mask, and the cohort gets ClinicaDL's TSVs: ``labels.tsv``, ``split/train.tsv``,
``split/train_baseline.tsv``, ``split/test_baseline.tsv``, ``split/<k>_fold/split-<i>/...``, and
``truth.tsv`` (each session's severity and hippocampal and ventricular volumes).

    lightning-hybrid data make-adni-like OUT --subjects 300

Nothing here knows Lightning; it uses torch, numpy, scipy, nibabel and MONAI.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import cached_property
from multiprocessing import get_context
from pathlib import Path

import nibabel as nib
import numpy as np
import torch
import torch.nn.functional as F

from lightning_hybrid.lightning.data.clinicadl import CROP_BOX, CROPPED_SHAPE, label_code, t1_linear_affine, write_tsv

log = logging.getLogger(__name__)

#: Where Debian's ``mricron-data`` puts Colin27 (``ch2``, ``ch2bet``) and the AAL atlas.
MRICRON_TEMPLATES = Path("/usr/share/mricron/templates")
#: AAL labels of the left and right hippocampus.
AAL_HIPPOCAMPI = (37, 38)
#: Mean and standard deviation of the atrophy severity per diagnosis (1 = a typical AD subject).
SEVERITY = {"CN": (0.0, 0.4), "sMCI": (0.35, 0.4), "MCI": (0.5, 0.4), "pMCI": (0.75, 0.4), "AD": (1.0, 0.4)}
#: Severity added per year of follow-up.
PROGRESSION = {"CN": 0.02, "sMCI": 0.05, "MCI": 0.1, "pMCI": 0.25, "AD": 0.3}
#: The share of a subject's severity its ventricles show. Hippocampal atrophy comes first in Alzheimer's
#: disease and ventricular enlargement later: at MCI the atrophy is partly present (the hippocampi at the
#: subject's severity, the ventricles at half of it), at AD (and at CN's normal ageing) both.
VENTRICLES_SHARE = {"CN": 1.0, "sMCI": 0.5, "MCI": 0.5, "pMCI": 0.5, "AD": 1.0}
#: File names of a session's atrophy and brain masks, beside its t1-linear image.
MASK_SUFFIX = "space-MNI152NLin2009cSym_desc-Crop_res-1x1x1_label-atrophy_mask.nii.gz"
BRAIN_SUFFIX = "space-MNI152NLin2009cSym_desc-Crop_res-1x1x1_label-brain_mask.nii.gz"
IMAGE_SUFFIX = "space-MNI152NLin2009cSym_desc-Crop_res-1x1x1_T1w.nii.gz"


class TemplateNotFoundError(FileNotFoundError):
    """Colin27 or the AAL atlas is missing; the message says how to get them."""


@dataclass(frozen=True)
class CohortSettings:
    """What :func:`write_cohort` draws. Distances in mm of boundary displacement at severity 1."""

    subjects: dict[str, int] = field(default_factory=lambda: {"AD": 120, "CN": 120})
    seed: int = 0
    hippocampus_mm: float = 0.75
    ventricles_mm: float = 1.2
    severity: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(SEVERITY))
    followup_fraction: float = 0.25  # subjects with a second session (ses-M012)
    elastic_mm: float = 2.5  # RMS of the subject's own deformation
    elastic_sigma_mm: float = 12.0
    rotate_deg: float = 3.0
    scale: float = 0.03
    translate_mm: float = 2.0
    bias_coeff: float = 0.2
    noise: float = 0.06  # Rician noise, up to this fraction of the image's standard deviation
    test_fraction: float = 0.25
    n_splits: int = 5


@dataclass
class Anatomy:
    """The template in t1-linear's cropped grid: the head, and the regions atrophy acts on."""

    t1: np.ndarray  # float32, the head with its skull
    brain: np.ndarray  # bool (Colin27's skull-stripped brain)
    hippocampi: np.ndarray  # bool
    ventricles: np.ndarray  # bool

    @cached_property
    def affine(self) -> np.ndarray:
        return t1_linear_affine(cropped=True)


def _into_cropped_grid(volume: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """A 1 mm RAS volume in MNI space moved (by whole voxels) into t1-linear's cropped grid, zeros outside."""
    if not np.allclose(affine[:3, :3], np.eye(3)):
        raise ValueError(f"expected a 1 mm RAS volume without rotation, got the affine\n{affine}")
    target = t1_linear_affine(cropped=True)
    offset = np.rint(target[:3, 3] - affine[:3, 3]).astype(int)  # index in volume = index in target + offset
    out = np.zeros(CROPPED_SHAPE, volume.dtype)
    src = [slice(max(o, 0), min(o + n, s)) for o, n, s in zip(offset, CROPPED_SHAPE, volume.shape)]
    dst = [slice(sl.start - o, sl.stop - o) for sl, o in zip(src, offset)]
    out[tuple(dst)] = volume[tuple(src)]
    return out


def lateral_ventricles(brain: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """The lateral (and third) ventricles of a skull-stripped 1 mm MNI-space T1: dark voxels deep in the brain,
    near the midline, in components of at least 1 cm^3."""
    from scipy import ndimage

    inner = ndimage.binary_erosion(brain > 0, iterations=8)
    dark = inner & (brain < 0.3 * np.percentile(brain[brain > 0], 95))
    world = np.stack(np.meshgrid(*[np.arange(n) for n in brain.shape], indexing="ij"), -1) + affine[:3, 3]
    box = (np.abs(world[..., 0]) <= 36) & (world[..., 1] >= -64) & (world[..., 1] <= 34) & (world[..., 2] >= -4) & (world[..., 2] <= 34)
    labels, count = ndimage.label(dark & box)
    sizes = ndimage.sum(dark & box, labels, range(1, count + 1))
    keep = np.isin(labels, 1 + np.flatnonzero(sizes >= 1000))
    return ndimage.binary_closing(keep, iterations=1)


def load_colin27(folder: str | Path = MRICRON_TEMPLATES) -> Anatomy:
    """Colin27 (``ch2.nii.gz``, ``ch2bet.nii.gz``) and AAL (``aal.nii.gz``) from ``folder`` in t1-linear's grid."""
    folder = Path(folder)
    names = ("ch2.nii.gz", "ch2bet.nii.gz", "aal.nii.gz")
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise TemplateNotFoundError(
            f"{folder} lacks {', '.join(missing)}: Colin27 and the AAL atlas come with Debian's mricron-data "
            "(apt-get install mricron-data), or pass the folder that holds ch2.nii.gz, ch2bet.nii.gz and aal.nii.gz"
        )
    images = {n: nib.load(folder / n) for n in names}
    head, brain, aal = (np.asanyarray(images[n].dataobj) for n in names)
    affine = images["ch2.nii.gz"].affine
    ventricles = lateral_ventricles(brain.astype(np.float32), affine)
    return Anatomy(
        t1=_into_cropped_grid(head.astype(np.float32), affine),
        brain=_into_cropped_grid(brain > 0, affine),
        hippocampi=_into_cropped_grid(np.isin(aal, AAL_HIPPOCAMPI), affine),
        ventricles=_into_cropped_grid(ventricles, affine),
    )


def outward_field(region: np.ndarray, sigma_mm: float = 2.0) -> np.ndarray:
    """A unit-peak displacement field (3, X, Y, Z) pointing out of ``region`` across its smoothed boundary.

    Sampling an image at ``x + a * field(x)`` moves the region's boundary inwards by about ``a`` mm
    (it shrinks); at ``x - a * field(x)`` outwards (it grows)."""
    from scipy import ndimage

    smooth = ndimage.gaussian_filter(region.astype(np.float32), sigma_mm)
    gradient = -np.stack(np.gradient(smooth), 0)
    return (gradient / max(float(np.linalg.norm(gradient, axis=0).max()), 1e-12)).astype(np.float32)


@dataclass
class _Template:
    """What every subject is drawn from, prepared once per cohort (shared with the worker processes)."""

    anatomy: Anatomy
    settings: CohortSettings

    @cached_property
    def fields(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The hippocampi's and the ventricles' unit fields, as (1, 3, X, Y, Z) tensors in voxels."""
        a = self.anatomy
        return torch.from_numpy(outward_field(a.hippocampi))[None], torch.from_numpy(-outward_field(a.ventricles))[None]

    @cached_property
    def affected(self) -> np.ndarray:
        """Where atrophy moves tissue: the regions and the band around them where the field is over a quarter of its peak."""
        hippocampi, ventricles = self.fields
        strength = torch.maximum(hippocampi[0].norm(dim=0), ventricles[0].norm(dim=0)).numpy()
        return self.anatomy.hippocampi | self.anatomy.ventricles | (strength > 0.25)


def _sample(volume: torch.Tensor, points: torch.Tensor, mode: str = "bilinear") -> torch.Tensor:
    """``volume`` (1, C, X, Y, Z) at ``points`` (X', Y', Z', 3) given in its voxel indices; zeros outside."""
    size = torch.tensor(volume.shape[2:], dtype=points.dtype)
    grid = (2 * points / (size - 1) - 1).flip(-1)  # grid_sample wants (z, y, x) order in [-1, 1]
    return F.grid_sample(volume, grid[None], mode=mode, padding_mode="zeros", align_corners=True)[0]


def _smooth_random_field(rng: np.random.Generator, rms_mm: float, sigma_mm: float, spacing_mm: float = 4.0) -> torch.Tensor:
    """Gaussian-smoothed random offsets (3, x, y, z) on a ``spacing_mm`` grid over the cropped volume, RMS ``rms_mm``."""
    from scipy import ndimage

    shape = [int(np.ceil(n / spacing_mm)) + 1 for n in CROPPED_SHAPE]
    noise = rng.standard_normal((3, *shape)).astype(np.float32)
    smooth = np.stack([ndimage.gaussian_filter(c, sigma_mm / spacing_mm, mode="wrap") for c in noise])
    smooth *= rms_mm / max(float(np.sqrt((smooth**2).sum(0).mean())), 1e-12)
    return torch.from_numpy(smooth)


def _affine_matrix(rng: np.random.Generator, s: CohortSettings) -> np.ndarray:
    """A small random rotation, scaling and translation about the volume's centre, in voxel indices."""
    ax, ay, az = np.deg2rad(rng.uniform(-s.rotate_deg, s.rotate_deg, 3))
    rx = np.array([[1, 0, 0], [0, np.cos(ax), -np.sin(ax)], [0, np.sin(ax), np.cos(ax)]])
    ry = np.array([[np.cos(ay), 0, np.sin(ay)], [0, 1, 0], [-np.sin(ay), 0, np.cos(ay)]])
    rz = np.array([[np.cos(az), -np.sin(az), 0], [np.sin(az), np.cos(az), 0], [0, 0, 1]])
    linear = rz @ ry @ rx @ np.diag(1 + rng.uniform(-s.scale, s.scale, 3))
    centre = (np.array(CROPPED_SHAPE) - 1) / 2
    matrix = np.eye(4)
    matrix[:3, :3] = linear
    matrix[:3, 3] = centre - linear @ centre + rng.uniform(-s.translate_mm, s.translate_mm, 3)
    return matrix


@dataclass
class Session:
    """One scan to write: who, when, and what was drawn for it."""

    participant_id: str
    session_id: str
    diagnosis: str
    severity: float
    subject_seed: int
    session_seed: int
    age: float
    sex: str


def render(template: _Template, session: Session) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, float]]:
    """The session's image (float32), its atrophy and brain masks (uint8) and its volumes (mm^3), in the cropped grid."""
    from monai.transforms import RandBiasField, RandRicianNoise

    s, a = template.settings, template.anatomy
    subject_rng, session_rng = np.random.default_rng(session.subject_seed), np.random.default_rng(session.session_seed)
    elastic = _smooth_random_field(subject_rng, s.elastic_mm, s.elastic_sigma_mm)
    matrix = torch.from_numpy(_affine_matrix(session_rng, s)).float()
    index = torch.stack(torch.meshgrid(*[torch.arange(n, dtype=torch.float32) for n in CROPPED_SHAPE], indexing="ij"), -1)
    pose = index @ matrix[:3, :3].T + matrix[:3, 3]  # the session's residual affine
    anatomy = pose + _sample(elastic[None], pose / 4.0).permute(1, 2, 3, 0)  # the subject's own shape (4 mm grid)
    hippocampi, ventricles = template.fields
    ventricles_severity = session.severity * VENTRICLES_SHARE[session.diagnosis]
    atrophy = s.hippocampus_mm * session.severity * hippocampi + s.ventricles_mm * ventricles_severity * ventricles
    points = anatomy + _sample(atrophy, anatomy).permute(1, 2, 3, 0)
    t1 = torch.from_numpy(a.t1)[None, None]
    image = _sample(t1, points)  # (1, X, Y, Z)
    regions = torch.from_numpy(np.stack([a.hippocampi, a.ventricles, a.brain]).astype(np.float32))[None]
    warped_regions = _sample(regions, points, mode="nearest")
    mask = _sample(torch.from_numpy(template.affected.astype(np.float32))[None, None], anatomy, mode="nearest")[0]
    seed = int(session_rng.integers(2**31))
    bias = RandBiasField(degree=3, coeff_range=(0.0, s.bias_coeff), prob=1.0)
    bias.set_random_state(seed)
    noise = RandRicianNoise(prob=1.0, std=s.noise, relative=True, sample_std=True)
    noise.set_random_state(seed + 1)
    gain = float(session_rng.uniform(3.0, 5.0))
    image = noise(bias(image) * gain)
    volumes = {"hippocampus_mm3": float(warped_regions[0].sum()), "ventricles_mm3": float(warped_regions[1].sum())}
    brain = warped_regions[2].numpy().astype(np.uint8)
    return np.asarray(image[0], dtype=np.float32), mask.numpy().astype(np.uint8), brain, volumes


_TEMPLATE: _Template | None = None  # the worker processes' copy


def _init_worker(template: _Template) -> None:
    global _TEMPLATE
    torch.set_num_threads(1)
    _TEMPLATE = template


def _write_session(args: tuple[Session, str]) -> dict:
    session, folder = args
    assert _TEMPLATE is not None
    image, mask, brain, volumes = render(_TEMPLATE, session)
    out = Path(folder) / "subjects" / session.participant_id / session.session_id / "t1_linear"
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{session.participant_id}_{session.session_id}_"
    affine = _TEMPLATE.anatomy.affine
    nifti = nib.Nifti1Image(np.clip(np.rint(image), -32768, 32767).astype(np.int16), affine)
    nifti.header.set_xyzt_units("mm")
    _save_atomically(nifti, out / (stem + IMAGE_SUFFIX))
    _save_atomically(nib.Nifti1Image(mask, affine), out / (stem + MASK_SUFFIX))
    _save_atomically(nib.Nifti1Image(brain, affine), out / (stem + BRAIN_SUFFIX))
    return {**asdict(session), **volumes}


def _save_atomically(image: nib.Nifti1Image, path: Path) -> None:
    temporary = path.with_name(f".{path.name}.partial.nii.gz")
    nib.save(image, temporary)
    os.replace(temporary, path)


def draw_sessions(settings: CohortSettings) -> list[Session]:
    """The cohort's sessions: subjects in diagnosis order, ADNI-style IDs, severities, seeds, follow-ups."""
    rng = np.random.default_rng(settings.seed)
    total = sum(settings.subjects.values())
    rids = rng.choice(np.arange(1, 10000), size=total, replace=False)
    sessions = []
    number = 0
    for diagnosis, count in settings.subjects.items():
        if diagnosis not in settings.severity:
            raise ValueError(f"unknown diagnosis {diagnosis!r}; choose among {sorted(settings.severity)}")
        mean, std = settings.severity[diagnosis]
        for _ in range(count):
            participant = f"sub-ADNI{int(rng.integers(2, 200)):03d}S{int(rids[number]):04d}"
            severity = float(rng.normal(mean, std))
            subject_seed = int(rng.integers(2**31))
            age, sex = float(np.clip(rng.normal(75, 6.5), 55, 95)), str(rng.choice(["M", "F"]))
            months = [0, 12] if rng.random() < settings.followup_fraction else [0]
            for month in months:
                sessions.append(Session(
                    participant, f"ses-M{month:03d}", diagnosis, severity + PROGRESSION[diagnosis] * month / 12,
                    subject_seed, int(rng.integers(2**31)), round(age + month / 12, 1), sex,
                ))
            number += 1
    return sessions


def _stratified_folds(subjects: dict[str, str], folds: int, rng: np.random.Generator) -> list[list[str]]:
    """Subjects (name -> diagnosis) dealt into ``folds`` groups, each diagnosis spread evenly."""
    groups: list[list[str]] = [[] for _ in range(folds)]
    for diagnosis in sorted(set(subjects.values())):
        names = sorted(n for n, d in subjects.items() if d == diagnosis)
        rng.shuffle(names)
        for i, name in enumerate(names):
            groups[i % folds].append(name)
    return groups


def write_splits(folder: Path, rows: Sequence[dict], settings: CohortSettings) -> None:
    """ClinicaDL's TSVs for ``rows``: ``labels.tsv``, ``split/`` (``tsvtools split --subset_name test``) and
    ``split/<k>_fold/split-<i>/`` (``tsvtools kfold --subset_name validation``), stratified by diagnosis."""
    columns = ["participant_id", "session_id", "age", "sex", "diagnosis"]
    rows = sorted(rows, key=lambda r: (r["participant_id"], r["session_id"]))
    write_tsv(folder / "labels.tsv", rows, columns)
    rng = np.random.default_rng(settings.seed + 1)
    diagnosis = {r["participant_id"]: r["diagnosis"] for r in rows}
    n_test = max(1, round(1 / settings.test_fraction)) if settings.test_fraction > 0 else 0
    test = set(_stratified_folds(diagnosis, n_test, rng)[0]) if n_test else set()

    def written(name: str, keep: set[str], baseline: bool) -> None:
        chosen = [r for r in rows if r["participant_id"] in keep and (not baseline or r["session_id"] == "ses-M000")]
        write_tsv(name_folder / name, chosen, columns)

    name_folder = folder / "split"
    train = set(diagnosis) - test
    written("train.tsv", train, False)
    written("train_baseline.tsv", train, True)
    written("test_baseline.tsv", test, True)
    written("test.tsv", test, False)
    folds = _stratified_folds({n: d for n, d in diagnosis.items() if n in train}, settings.n_splits, rng)
    for i, validation in enumerate(folds):
        name_folder = folder / "split" / f"{settings.n_splits}_fold" / f"split-{i}"
        written("train.tsv", train - set(validation), False)
        written("train_baseline.tsv", train - set(validation), True)
        written("validation_baseline.tsv", set(validation), True)
        written("validation.tsv", set(validation), False)


def write_cohort(out: str | Path, settings: CohortSettings = CohortSettings(), templates: str | Path = MRICRON_TEMPLATES,
                 workers: int | None = None) -> Path:
    """Write the cohort into ``out`` (``out/caps``, ``out/labels.tsv``, ``out/split``, ``out/truth.tsv``); return ``out``.

    ``workers`` processes render sessions at once (default: this machine's cores). Progress is logged.
    """
    if sum(settings.subjects.values()) < 1:
        raise ValueError(f"subjects must hold at least one subject, got {settings.subjects}")
    if len(label_code(settings.subjects)) < 2:
        raise ValueError(f"a cohort needs two diagnoses to classify, got {sorted(settings.subjects)}")
    out = Path(out)
    template = _Template(load_colin27(templates), settings)
    template.fields, template.affected  # computed once here, inherited by the workers  # noqa: B018
    sessions = draw_sessions(settings)
    workers = max(1, min(workers or os.cpu_count() or 1, len(sessions)))
    log.info("writing %d sessions of %d subjects (%s) to %s with %d process(es)", len(sessions),
             sum(settings.subjects.values()), settings.subjects, out, workers)
    start, rows = time.perf_counter(), []
    jobs = [(session, str(out / "caps")) for session in sessions]
    with ProcessPoolExecutor(workers, mp_context=get_context("fork"), initializer=_init_worker, initargs=(template,)) as pool:
        for done, row in enumerate(pool.map(_write_session, jobs, chunksize=1), start=1):
            rows.append(row)
            if done % max(1, len(jobs) // 10) == 0 or done == len(jobs):
                elapsed = time.perf_counter() - start
                log.info("%d/%d sessions written (%.1f s each, %.0f s left)", done, len(jobs), elapsed / done * workers,
                         elapsed / done * (len(jobs) - done))
    write_splits(out, rows, settings)
    truth = ["participant_id", "session_id", "diagnosis", "severity", "hippocampus_mm3", "ventricles_mm3"]
    write_tsv(out / "truth.tsv", [{**r, "severity": f"{r['severity']:.4f}"} for r in rows], truth)
    return out
