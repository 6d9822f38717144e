# Generated from lightning_hybrid/data/idx.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""Reading IDX files (the MNIST container format) with numpy, with checksums and clear errors."""

from __future__ import annotations

import gzip
import hashlib
import zlib
from pathlib import Path

import numpy as np

# IDX type codes (third byte of the magic number) to numpy dtypes; multi-byte types are big-endian.
_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


class DataFileError(ValueError):
    """A data file is missing, corrupt, truncated or fails its checksum; the message names the file."""


def md5sum(path: str | Path, chunk_size: int = 1 << 20) -> str:
    """Hex md5 digest of the file at ``path``."""
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_md5(path: str | Path, expected: str) -> None:
    """Raise :class:`DataFileError` naming ``path`` when its md5 is not ``expected``."""
    actual = md5sum(path)
    if actual != expected:
        raise DataFileError(
            f"{path}: md5 mismatch (expected {expected}, got {actual}); the file is damaged or not the "
            "expected release. Delete it and download it again."
        )


def parse_idx(data: bytes, name: str = "<bytes>") -> np.ndarray:
    """Decode the bytes of an (uncompressed) IDX file into an array of its declared shape and type."""
    if len(data) < 4:
        raise DataFileError(f"{name}: truncated IDX file ({len(data)} bytes, no complete header)")
    zero, type_code, ndim = data[0] | data[1], data[2], data[3]
    if zero != 0 or type_code not in _IDX_DTYPES or ndim == 0:
        raise DataFileError(
            f"{name}: not an IDX file (magic bytes {data[:4].hex()}; expected 0000, a type code in "
            f"{[hex(c) for c in _IDX_DTYPES]}, and a dimension count)"
        )
    header_size = 4 + 4 * ndim
    if len(data) < header_size:
        raise DataFileError(f"{name}: truncated IDX file (header needs {header_size} bytes, file has {len(data)})")
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_DTYPES[type_code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    payload = len(data) - header_size
    if payload < expected:
        raise DataFileError(
            f"{name}: truncated IDX file (shape {shape} needs {expected} data bytes, file has {payload})"
        )
    if payload > expected:
        raise DataFileError(f"{name}: corrupt IDX file ({payload - expected} bytes beyond the declared shape {shape})")
    return np.frombuffer(data, dtype=dtype, offset=header_size).reshape(shape).astype(dtype.newbyteorder("="))


def read_idx(path: str | Path, md5: str | None = None) -> np.ndarray:
    """Read an IDX file, gzip-compressed (``.gz``) or plain, optionally verifying its md5 first.

    Raises :class:`DataFileError` naming the file when it is missing, fails the checksum, is not
    valid gzip, or is not a complete IDX file.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{path}: no such file")
    if md5 is not None:
        verify_md5(path, md5)
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise DataFileError(f"{path}: corrupt or truncated gzip file ({err})") from err
    return parse_idx(raw, name=str(path))


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write ``array`` as an IDX file (gzip-compressed when ``path`` ends in ``.gz``)."""
    array = np.asarray(array)
    codes = {dtype: code for code, dtype in _IDX_DTYPES.items()}
    big_endian = array.dtype.newbyteorder(">") if array.dtype.itemsize > 1 else array.dtype
    if big_endian not in codes:
        raise ValueError(f"IDX has no type code for dtype {array.dtype}")
    header = bytes([0, 0, codes[big_endian], array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    payload = header + array.astype(big_endian).tobytes()
    path = Path(path)
    path.write_bytes(gzip.compress(payload) if path.suffix == ".gz" else payload)
