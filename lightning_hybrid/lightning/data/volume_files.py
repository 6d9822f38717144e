# Generated from lightning_hybrid/data/volume_files.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""One 3D volume from disk: a NIfTI file (nibabel) or ClinicaDL's extracted ``.pt`` tensor, with its affine.

:func:`load_volume` gives a MONAI ``MetaTensor`` ``(1, X, Y, Z)`` that carries the voxel-to-world
affine, so orientation and resampling work the same for both kinds; :func:`inspect_volume` reads a
file once to check it (readable, not truncated, 3D) and to hash its voxels (the same image under two
names is found by its content, whatever the file's name or gzip header).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
import torch
from monai.transforms import MapTransform

from lightning_hybrid.lightning.data.clinicadl import t1_linear_affine


class BadItemError(ValueError):
    """A table row or an image file the datamodule cannot use; the message names it."""


def _tensor_affine(path: Path) -> np.ndarray:
    """The affine of ClinicaDL's tensor ``.../deeplearning_prepare_data/image_based/t1_linear/NAME.pt``:
    its NIfTI's (``.../t1_linear/NAME.nii.gz``) where that exists, t1-linear's grid otherwise."""
    session = path.parents[3] if len(path.parents) > 3 else path.parent
    nifti = session / "t1_linear" / path.name.replace(".pt", ".nii.gz")
    if nifti.is_file():
        return np.asarray(nib.load(nifti).affine, dtype=np.float64)
    return t1_linear_affine(cropped="desc-Crop" in path.name)


def _read(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Voxels (float32, 3D when the file is) and affine; raises BadItemError naming the file."""
    if not path.is_file():
        raise BadItemError(f"{path}: no such file")
    try:
        if path.suffix == ".pt":
            tensor = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"holds a {type(tensor).__name__}, not a tensor")
            array = tensor.float().numpy()
            if array.ndim == 4 and array.shape[0] == 1:
                array = array[0]  # ClinicaDL's (1, X, Y, Z)
            return array, _tensor_affine(path)
        image = nib.load(path)
        return np.asarray(image.dataobj, dtype=np.float32), np.asarray(image.affine, dtype=np.float64)
    except Exception as err:  # nibabel and torch raise many types for damaged files
        raise BadItemError(f"{path}: not a readable NIfTI volume or tensor ({type(err).__name__}: {err})") from err


def _check_3d(path: Path, shape: tuple[int, ...]) -> None:
    if len(shape) != 3:
        raise BadItemError(f"{path}: a {len(shape)}D image of shape {shape}; a 3D structural volume is needed")


def load_volume(path: str | Path) -> "torch.Tensor":
    """The volume as a MONAI ``MetaTensor`` of shape ``(1, X, Y, Z)`` with its affine."""
    from monai.data import MetaTensor

    path = Path(path)
    array, affine = _read(path)
    _check_3d(path, array.shape)
    return MetaTensor(torch.from_numpy(np.ascontiguousarray(array))[None], affine=torch.as_tensor(affine),
                      meta={"filename_or_obj": str(path)})


@dataclass(frozen=True)
class VolumeInfo:
    shape: tuple[int, int, int]
    sha1: str  # of the voxels' float32 bytes and the shape


def inspect_volume(path: str | Path) -> VolumeInfo:
    """Read ``path`` whole (truncated files fail here), check it is 3D, and hash its voxels."""
    path = Path(path)
    array, _ = _read(path)
    _check_3d(path, array.shape)
    digest = hashlib.sha1(repr(array.shape).encode())
    digest.update(np.ascontiguousarray(array, dtype=np.float32).tobytes())
    return VolumeInfo(tuple(int(n) for n in array.shape), digest.hexdigest())


class InspectionCache:
    """:func:`inspect_volume`'s answers kept in ``folder/volumes.json``, keyed by path, size and
    modification time, so that a later run does not decode every volume again. Thread-safe."""

    def __init__(self, folder: str | Path | None) -> None:
        self.path = None if folder is None else Path(folder) / "volumes.json"
        self.entries: dict[str, list] = {}
        if self.path is not None and self.path.is_file():
            try:
                self.entries = json.loads(self.path.read_text())
            except (OSError, ValueError):
                self.entries = {}
        self._lock = threading.Lock()
        self._changed = False

    @staticmethod
    def _key(path: Path) -> str:
        stat = path.stat()
        return f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"

    def __call__(self, path: str | Path) -> VolumeInfo:
        path = Path(path)
        key = self._key(path) if path.is_file() else None
        with self._lock:
            cached = self.entries.get(key) if key else None
        if cached is not None:
            return VolumeInfo(tuple(cached[0]), cached[1])
        info = inspect_volume(path)
        with self._lock:
            self.entries[key] = [list(info.shape), info.sha1]
            self._changed = True
        return info

    def save(self) -> None:
        if self.path is None or not self._changed:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")
        temporary.write_text(json.dumps(self.entries))
        os.replace(temporary, self.path)


class LoadVolumed(MapTransform):
    """MONAI dictionary transform: ``item[key]`` (a path) replaced by :func:`load_volume`'s MetaTensor.
    A deterministic ``Transform``, so MONAI's persistent and cache datasets keep its output."""

    def __call__(self, item: dict) -> dict:
        item = dict(item)
        for key in self.keys:
            item[key] = load_volume(item[key])
        return item
