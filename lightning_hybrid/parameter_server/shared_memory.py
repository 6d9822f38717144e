"""Shared memory between a worker and the parameter server on the same host.

Through the side channel's gloo group every gradient and every parameter vector is copied into a
send buffer, through the kernel's TCP loopback, and out of a receive buffer: four copies and two
socket transfers of the model's size per push. A worker on the server's host instead keeps one
:class:`SharedSegment` with the server: a file in ``/dev/shm`` that both map, with two regions of
the model's size, ``requests`` (the worker writes its gradient there) and ``replies`` (the server
writes the parameters there). The side channel still carries every message, without the bulk: the
message is what says that a region holds a complete vector, and since a worker has one request
outstanding at a time neither side writes a region while the other may read it (a worker writes
its next gradient only after the reply to its last push, the server writes parameters only in the
reply to a request), so no second buffer is needed for a reader never to see a half-written step.

The segment's name leaves ``/dev/shm`` as soon as both sides have mapped it (:meth:`SharedSegment.attach`
unlinks it, the worker unlinks it once the server answered): the memory lives as long as the two
mappings, and a process that dies, however it dies, leaves no file behind.

Example::

    >>> import torch
    >>> mine = SharedSegment.create(region_bytes=16)
    >>> theirs = SharedSegment.attach(mine.name, region_bytes=16)
    >>> mine.write("requests", torch.arange(4.0))
    >>> theirs.view("requests", torch.float32, 4)
    tensor([0., 1., 2., 3.])
    >>> mine.unlink()
"""

from __future__ import annotations

import mmap
import os
import re
import secrets
from pathlib import Path

import torch

#: Where the segments live (tmpfs on Linux).
SHM_DIR = Path("/dev/shm")
#: The regions of a segment, in order: worker -> server, server -> worker.
REGIONS = ("requests", "replies")
_NAME = re.compile(r"lh-ps-\d+-[0-9a-f]{16}")


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 64) * 64


class SharedSegment:
    """Two regions of ``region_bytes`` each in one memory-mapped file (see the module docstring)."""

    def __init__(self, name: str, region_bytes: int, memory: mmap.mmap, path: Path) -> None:
        self.name, self.region_bytes, self.path = name, region_bytes, path
        self._memory = memory  # kept alive as long as the tensors viewing it
        data = torch.frombuffer(memory, dtype=torch.uint8)
        stride = _aligned(region_bytes)
        self._regions = {region: data[i * stride : i * stride + region_bytes] for i, region in enumerate(REGIONS)}

    @staticmethod
    def nbytes(region_bytes: int) -> int:
        """The size of the file of a segment with regions of ``region_bytes``."""
        return len(REGIONS) * _aligned(region_bytes)

    @classmethod
    def create(cls, region_bytes: int, directory: Path = SHM_DIR) -> SharedSegment:
        """A new segment, its memory reserved now (an ``OSError`` if ``directory`` has no room for
        it, rather than a SIGBUS at the first write beyond what the file system could give)."""
        if region_bytes < 1:
            raise ValueError(f"a shared segment needs regions of at least one byte, got {region_bytes}")
        name = f"lh-ps-{os.getpid()}-{secrets.token_hex(8)}"
        path = Path(directory) / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            size = cls.nbytes(region_bytes)
            os.posix_fallocate(fd, 0, size)
            memory = mmap.mmap(fd, size)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        return cls(name, region_bytes, memory, path)

    @classmethod
    def attach(cls, name: str, region_bytes: int, directory: Path = SHM_DIR) -> SharedSegment:
        """Map the segment ``name`` another process created, and remove its name (whatever happens:
        a ``FileNotFoundError`` when there is no such segment here, a ``ValueError`` for a name this
        module does not make or a file of another size)."""
        if not _NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not the name of a parameter-server segment")
        path = Path(directory) / name
        fd = os.open(path, os.O_RDWR)
        try:
            size = cls.nbytes(region_bytes)
            found = os.fstat(fd).st_size
            if found != size:
                raise ValueError(f"segment {name} has {found} bytes, expected {size}")
            memory = mmap.mmap(fd, size)
        finally:
            os.close(fd)
            path.unlink(missing_ok=True)
        return cls(name, region_bytes, memory, path)

    def unlink(self) -> None:
        """Remove the segment's name (the memory stays mapped until both processes let go of it)."""
        self.path.unlink(missing_ok=True)

    def write(self, region: str, tensor: torch.Tensor, dtype: torch.dtype | None = None) -> None:
        """Copy ``tensor`` (converted to ``dtype``, default its own) into the start of ``region``."""
        dtype = dtype or tensor.dtype
        count = tensor.numel()
        self.view(region, dtype, count).copy_(tensor.detach().reshape(-1))

    def view(self, region: str, dtype: torch.dtype, count: int) -> torch.Tensor:
        """The first ``count`` values of ``region`` as ``dtype``, to read or to write in place (read:
        valid until the other side writes the region again, which the protocol says when)."""
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        if nbytes > self.region_bytes:
            raise ValueError(f"{count} values of {dtype} need {nbytes} bytes; the region {region!r} has {self.region_bytes}")
        return self._regions[region][:nbytes].view(dtype)
