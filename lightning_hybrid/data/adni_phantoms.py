"""ADNI phantoms: synthetic structural MRI, NIfTI volumes and a CSV in ADNIDataModule's layout, for
running the whole pipeline in seconds without ADNI access (tests, smoke runs, throughput). Not anatomy:
the benchmark on a real brain template and atlas is :mod:`lightning_hybrid.data.adni_like`.

Each volume is a head-like ellipsoid (skull
shell, grey/white matter, CSF-filled ventricles, two hippocampus-like bodies) with per-subject
variation in size, position, intensity and noise. The class-dependent difference follows the
atrophy pattern of Alzheimer's disease: AD and pMCI subjects get enlarged ventricles and shrunken
hippocampi, NC and sMCI subjects do not (to a lesser degree for the MCI pair). Some subjects have
several scans (visits). The files carry a realistic header: 1.2 x 1.0 x 1.0 mm voxels and a
non-canonical (LPS-like) orientation, so that reorientation and resampling are exercised.
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import nibabel as nib
import numpy as np

from lightning_hybrid.deprecation import renamed

log = logging.getLogger(__name__)

SPACING = (1.2, 1.0, 1.0)
#: (ventricle scale, hippocampus scale) per diagnosis: atrophy in AD and, milder, in pMCI.
ATROPHY = {"NC": (1.0, 1.0), "AD": (1.6, 0.65), "sMCI": (1.1, 0.92), "pMCI": (1.45, 0.72)}


def _ellipsoid(grid: tuple[np.ndarray, ...], center, radii) -> np.ndarray:
    return sum(((g - c) / r) ** 2 for g, c, r in zip(grid, center, radii)) <= 1.0


def synthetic_volume(shape: tuple[int, int, int], diagnosis: str, rng: np.random.Generator) -> np.ndarray:
    """One float32 volume of ``shape`` with the structural pattern of ``diagnosis``."""
    ventricle_scale, hippo_scale = ATROPHY[diagnosis]
    grid = np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij")
    size = rng.uniform(0.9, 1.05)
    shift = rng.uniform(-0.04, 0.04, 3)
    head = _ellipsoid(grid, shift, (0.85 * size, 0.9 * size, 0.85 * size))
    brain = _ellipsoid(grid, shift, (0.75 * size, 0.8 * size, 0.75 * size))
    white = _ellipsoid(grid, shift, (0.5 * size, 0.55 * size, 0.5 * size))
    volume = np.zeros(shape, np.float32)
    volume[head] = rng.uniform(250, 300)  # scalp and skull
    volume[brain] = rng.uniform(550, 650)  # grey matter
    volume[white] = rng.uniform(750, 850)  # white matter
    v = ventricle_scale * rng.uniform(0.9, 1.1)
    for side in (-1, 1):
        ventricle = _ellipsoid(grid, shift + (0.0, 0.0, side * 0.1), (0.12 * v, 0.3 * v, 0.07 * v))
        volume[ventricle] = rng.uniform(80, 120)  # CSF
        h = hippo_scale * rng.uniform(0.92, 1.08)
        hippocampus = _ellipsoid(grid, shift + (-0.25, 0.05, side * 0.3), (0.08 * h, 0.16 * h, 0.06 * h))
        volume[hippocampus] = rng.uniform(620, 680)
    volume += rng.normal(0, 25, shape).astype(np.float32)
    return np.clip(volume, 0, None)


def synthetic_affine(shape: tuple[int, int, int], spacing=SPACING) -> np.ndarray:
    """An LPS-like affine (x and y flipped) with ``spacing`` mm voxels, centred on the volume."""
    affine = np.diag([-spacing[0], -spacing[1], spacing[2], 1.0])
    affine[:3, 3] = [spacing[0] * shape[0] / 2, spacing[1] * shape[1] / 2, -spacing[2] * shape[2] / 2]
    return affine


def write_adni_phantoms(
    out: str | Path,
    subjects: int = 40,
    shape: tuple[int, int, int] = (64, 76, 64),
    seed: int = 0,
    extra_scan_prob: float = 0.3,
    diagnoses: tuple[str, ...] = ("AD", "NC", "sMCI", "pMCI"),
) -> Path:
    """Write ``subjects`` subjects (diagnoses in turn) to ``out/images/*.nii.gz`` and ``out/adni.csv``.

    Returns the CSV's path. Columns: ``subject_id``, ``image`` (relative to the CSV), ``diagnosis``,
    ``visit``. About ``extra_scan_prob`` of the subjects have a second scan.
    """
    if subjects < 1:
        raise ValueError(f"subjects must be positive, got {subjects}")
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    affine = synthetic_affine(shape)
    rows = []
    for s in range(subjects):
        diagnosis = diagnoses[s % len(diagnoses)]
        subject = f"{100 + s:03d}_S_{1000 + s:04d}"  # ADNI's PTID style
        visits = 2 if rng.random() < extra_scan_prob else 1
        for visit in range(visits):
            name = f"images/{subject}_v{visit}.nii.gz"
            image = nib.Nifti1Image(synthetic_volume(shape, diagnosis, rng), affine)
            image.header.set_xyzt_units("mm", "sec")
            nib.save(image, out / name)
            rows.append({"subject_id": subject, "image": name, "diagnosis": diagnosis, "visit": visit})
    csv_path = out / "adni.csv"
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["subject_id", "image", "diagnosis", "visit"])
        writer.writeheader()
        writer.writerows(rows)
    log.info("wrote %d scans of %d synthetic subjects to %s", len(rows), subjects, out)
    return csv_path


#: ``write_synthetic_adni``, its name until 2026-11-29.
__getattr__ = renamed(globals(), {"write_synthetic_adni": "lightning_hybrid.data.adni_phantoms:write_adni_phantoms"})
