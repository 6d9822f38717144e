# Generated from lightning_hybrid/data/shards.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""A sharded dataset store: fixed-size shards in a folder (local or an fsspec URL), loaded once per worker.

cNeural (paper 002) keeps its training set in a distributed store and has each worker load its own
shard once, in parallel, and keep it resident. Here a store is a folder of ``shard-NNNNN.npz`` files
(arrays ``x`` and ``y``) and a ``manifest.json`` (sample count, shapes, dtypes and each shard's
sample count, size and md5). Any fsspec URL works as the folder (``s3://``, ``hdfs://``, ``memory://``)
when the matching fsspec backend is installed.

Example::

    >>> import numpy as np
    >>> store = pack(np.zeros((10, 2), np.float32), np.arange(10), "memory://doc-store", shard_size=4)
    >>> store.num_shards, store.num_samples, assign_shards(store.num_shards, workers=2, rank=1)
    (3, 10, [1])
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import fsspec
import numpy as np

FORMAT = "lightning-hybrid-shards/1"
MANIFEST = "manifest.json"
# numpy parses a .npy header with ast.literal_eval, which CPython 3.11 before 3.11.8 cannot run in
# several threads at once ("SystemError: AST constructor recursion depth mismatch", CPython gh-106905).
# Shards are read and md5-checked concurrently; only decoding the in-memory bytes is serialized.
_DECODE_LOCK = threading.Lock()


class ShardError(ValueError):
    """A store, shard or quota problem; the message names the file or the numbers."""


def _join(root: str, name: str) -> str:
    return root.rstrip("/") + "/" + name


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.npz"


def pack(x: np.ndarray, y: np.ndarray, root: str, shard_size: int) -> ShardStore:
    """Write ``x`` and ``y`` (same length) as shards of ``shard_size`` samples into ``root``."""
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} samples but y has {len(y)}")
    with ShardWriter(root, shard_size) as writer:
        writer.write(x, y)
    return writer.store


class ShardWriter:
    """Write a store batch by batch: the streaming form of :func:`pack` (which uses it).

    ``write(x, y)`` buffers samples and writes every full shard of ``shard_size`` samples as soon as
    it has one, so memory stays at about one shard plus the batch; ``close()`` writes the last,
    partial shard and then the manifest, and returns the :class:`ShardStore`. As a context manager it
    closes on a normal exit; after an exception it writes no manifest, so a half-written store never
    loads. Any manifest already in ``root`` is deleted when the writer opens, for the same reason.
    Every batch must have the same per-sample shape and the same dtypes as the first. ``on_shard``,
    when given, is called with the writer after each shard is written (for progress reports).

    Example::

        >>> import numpy as np
        >>> with ShardWriter("memory://doc-writer", shard_size=4) as writer:
        ...     for start in range(0, 10, 3):
        ...         y = np.arange(start, min(start + 3, 10))
        ...         writer.write(np.full((len(y), 2), start, np.uint8), y)
        >>> [s["samples"] for s in writer.store.shards], writer.store.load([2])[1].tolist()
        ([4, 4, 2], [8, 9])
    """

    def __init__(self, root: str, shard_size: int, on_shard: Callable[[ShardWriter], None] | None = None) -> None:
        if shard_size < 1:
            raise ValueError(f"shard_size must be >= 1, got {shard_size}")
        self.root, self.shard_size, self.on_shard = root, int(shard_size), on_shard
        self.fs, self.path = fsspec.core.url_to_fs(root)
        self.fs.makedirs(self.path, exist_ok=True)
        if self.fs.exists(_join(self.path, MANIFEST)):
            self.fs.rm(_join(self.path, MANIFEST))
        self.shards: list[dict] = []
        self.num_samples = 0  # samples written to shards so far (not counting the buffer)
        self.store: ShardStore | None = None
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_samples = 0
        self._x_spec: tuple[tuple[int, ...], np.dtype] | None = None
        self._y_spec: tuple[tuple[int, ...], np.dtype] | None = None

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and self.store is None:
            self.close()

    def write(self, x: np.ndarray, y: np.ndarray) -> None:
        """Add a batch (``x`` and ``y`` of the same length); writes each shard that fills up."""
        if self.store is not None:
            raise ShardError(f"the writer of {self.root} is closed")
        x, y = np.asarray(x), np.asarray(y)
        if x.ndim == 0 or y.ndim == 0 or len(x) != len(y):
            raise ValueError(f"x has {len(x) if x.ndim else 'no'} samples but y has {len(y) if y.ndim else 'no'}")
        self._x_spec = self._check_spec("x", x, self._x_spec)
        self._y_spec = self._check_spec("y", y, self._y_spec)
        start = 0
        if self._pending_samples:  # top the buffer up to a full shard first
            take = min(self.shard_size - self._pending_samples, len(x))
            self._buffer(x[:take], y[:take])
            start = take
            if self._pending_samples < self.shard_size:
                return
            px, py = (np.concatenate(parts) for parts in zip(*self._pending))
            self._pending, self._pending_samples = [], 0
            self._write_shard(px, py)
        while len(x) - start >= self.shard_size:  # full shards straight from the batch, no copy
            self._write_shard(x[start: start + self.shard_size], y[start: start + self.shard_size])
            start += self.shard_size
        if start < len(x):
            self._buffer(x[start:], y[start:])

    def close(self) -> ShardStore:
        """Write the last, partial shard and the manifest; return the store (again on a second call)."""
        if self.store is not None:
            return self.store
        if self._x_spec is None or self._y_spec is None:
            raise ShardError(f"nothing was written to {self.root}; a store needs at least one (possibly empty) batch")
        if self._pending_samples:
            px, py = (np.concatenate(parts) for parts in zip(*self._pending))
            self._pending, self._pending_samples = [], 0
            self._write_shard(px, py)
        (x_shape, x_dtype), (_, y_dtype) = self._x_spec, self._y_spec
        manifest = {"format": FORMAT, "num_samples": int(self.num_samples), "shard_size": self.shard_size,
                    "x_shape": list(x_shape), "x_dtype": str(x_dtype), "y_dtype": str(y_dtype),
                    "shards": self.shards}
        with self.fs.open(_join(self.path, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)
        self.store = ShardStore(self.root)
        return self.store

    def _check_spec(self, name: str, a: np.ndarray, spec):
        if spec is None:
            return a.shape[1:], a.dtype
        if (a.shape[1:], a.dtype) != spec:
            raise ValueError(f"{name} batch has per-sample shape {a.shape[1:]} and dtype {a.dtype}, but the first "
                             f"batch of {self.root} had {spec[0]} and {spec[1]}")
        return spec

    def _buffer(self, x: np.ndarray, y: np.ndarray) -> None:
        if len(x):
            self._pending.append((x.copy(), y.copy()))  # copies: the caller may reuse its arrays
            self._pending_samples += len(x)

    def _write_shard(self, x: np.ndarray, y: np.ndarray) -> None:
        index = len(self.shards)
        buffer = io.BytesIO()
        np.savez(buffer, x=x, y=y)
        data = buffer.getvalue()
        with self.fs.open(_join(self.path, shard_name(index)), "wb") as f:
            f.write(data)
        self.shards.append({"name": shard_name(index), "samples": int(len(x)),
                            "bytes": len(data), "md5": hashlib.md5(data).hexdigest()})
        self.num_samples += len(x)
        if self.on_shard is not None:
            self.on_shard(self)


@dataclass
class ShardStore:
    """A packed store: its manifest, and loading of shards (verified against their md5)."""

    root: str

    def __post_init__(self) -> None:
        self.fs, self.path = fsspec.core.url_to_fs(self.root)
        manifest_path = _join(self.path, MANIFEST)
        if not self.fs.exists(manifest_path):
            raise ShardError(f"{self.root} is not a shard store: {MANIFEST} is missing (write one with "
                             "`lightning-hybrid data pack`)")
        with self.fs.open(manifest_path, "r") as f:
            self.manifest = json.load(f)
        if self.manifest.get("format") != FORMAT:
            raise ShardError(f"{self.root}/{MANIFEST}: unknown format {self.manifest.get('format')!r}, expected {FORMAT}")
        self.shards = self.manifest["shards"]

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def num_samples(self) -> int:
        return int(self.manifest["num_samples"])

    @property
    def largest_shard_bytes(self) -> int:
        return max(s["bytes"] for s in self.shards)

    def load_shard(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """One shard's ``(x, y)``; a missing or corrupt shard raises a ShardError naming it."""
        entry = self.shards[index]
        location = _join(self.path, entry["name"])
        try:
            with self.fs.open(location, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise ShardError(f"shard {entry['name']} of {self.root} is missing; repack the store") from None
        if hashlib.md5(data).hexdigest() != entry["md5"]:
            raise ShardError(f"shard {entry['name']} of {self.root} is corrupt (md5 mismatch); repack the store")
        with _DECODE_LOCK, np.load(io.BytesIO(data)) as arrays:
            x, y = arrays["x"], arrays["y"]
        if len(x) != entry["samples"]:
            raise ShardError(f"shard {entry['name']} of {self.root} holds {len(x)} samples, the manifest says {entry['samples']}")
        return x, y

    def load(self, indices: Sequence[int], threads: int = 4) -> tuple[np.ndarray, np.ndarray]:
        """The given shards, read concurrently and concatenated in order."""
        if not indices:
            shape = tuple(self.manifest["x_shape"])
            return np.empty((0, *shape), self.manifest["x_dtype"]), np.empty((0,), self.manifest["y_dtype"])
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(indices)))) as pool:
            parts = list(pool.map(self.load_shard, indices))
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def check_quota(self, quota_bytes: float, workers: int) -> None:
        """Raise a ShardError when a shard, or one worker's share, does not fit ``quota_bytes``."""
        if quota_bytes < self.largest_shard_bytes:
            raise ShardError(f"the memory quota ({quota_bytes / 2**20:.2f} MiB) is smaller than one shard "
                             f"({self.largest_shard_bytes / 2**20:.2f} MiB); raise the quota or repack with smaller shards")
        for rank in range(workers):
            need = sum(self.shards[i]["bytes"] for i in assign_shards(self.num_shards, workers, rank))
            if need > quota_bytes:
                raise ShardError(
                    f"the dataset is too big for the quota: worker {rank} of {workers} must hold {need / 2**20:.2f} MiB "
                    f"but the quota is {quota_bytes / 2**20:.2f} MiB; use more workers or a bigger quota"
                )


def assign_shards(num_shards: int, workers: int, rank: int) -> list[int]:
    """The shards worker ``rank`` of ``workers`` loads: round robin, every shard to exactly one worker."""
    if not 0 <= rank < workers:
        raise ValueError(f"rank must be in [0, {workers}), got {rank}")
    return list(range(rank, num_shards, workers))


def logical_workers(quota_bytes: float, cores: int | None = None, memory_bytes: float | None = None) -> int:
    """cNeural's load balance: a machine hosts ``k = min(cores, memory / quota)`` logical workers."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    if memory_bytes is None:
        memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    k = int(min(cores, memory_bytes // quota_bytes))
    if k < 1:
        raise ShardError(f"the memory quota ({quota_bytes / 2**30:.2f} GiB) is larger than this machine's memory "
                         f"({memory_bytes / 2**30:.2f} GiB); lower the quota")
    return k
