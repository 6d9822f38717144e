"""Gradients and parameters through shared memory: the segment, the server through it, the fallbacks.

The server is the real process, started as SSPStrategy starts it; the test process plays both
workers (see test_parameter_server).
"""

from __future__ import annotations

import errno
import logging
import os

import pytest
import torch

from lightning_hybrid.parameter_server.shared_memory import SHM_DIR, SharedSegment
from parameter_servers import make_optimizer, reference_apply, running_server

pytestmark = pytest.mark.skipif(not SHM_DIR.is_dir(), reason=f"no {SHM_DIR} on this machine (shared memory is Linux's)")


def our_segments(pid: int | None = None) -> list[str]:
    """The parameter-server segments in /dev/shm (of process ``pid``, or anyone's)."""
    prefix = f"lh-ps-{pid}-" if pid is not None else "lh-ps-"
    return sorted(p.name for p in SHM_DIR.iterdir() if p.name.startswith(prefix))


def test_a_segment_is_shared_and_leaves_no_name_behind():
    mine = SharedSegment.create(region_bytes=4 * 5)
    assert (SHM_DIR / mine.name).exists()
    theirs = SharedSegment.attach(mine.name, region_bytes=4 * 5)
    assert not (SHM_DIR / mine.name).exists(), "attach removes the name: a crash leaves nothing in /dev/shm"
    mine.unlink()  # the creator's unlink after the attach is harmless
    mine.write("requests", torch.arange(5.0))
    theirs.write("replies", torch.tensor([1.5, -2.0]), dtype=torch.bfloat16)
    assert theirs.view("requests", torch.float32, 5).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert mine.view("replies", torch.bfloat16, 2).tolist() == [1.5, -2.0]
    assert mine.view("requests", torch.float32, 5).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0], "the regions do not overlap"
    with pytest.raises(ValueError, match="6 values of torch.float32 need 24 bytes; the region 'requests' has 20"):
        mine.write("requests", torch.zeros(6))
    assert our_segments(os.getpid()) == []


def test_attach_refuses_what_is_not_a_segment_of_the_size_asked_and_removes_it(tmp_path):
    with pytest.raises(ValueError, match="not the name of a parameter-server segment"):
        SharedSegment.attach("../etc/passwd", 16)
    with pytest.raises(FileNotFoundError):
        SharedSegment.attach("lh-ps-1-0123456789abcdef", 16, directory=tmp_path)
    made = SharedSegment.create(region_bytes=16, directory=tmp_path)
    with pytest.raises(ValueError, match=f"segment {made.name} has 128 bytes, expected 256"):
        SharedSegment.attach(made.name, 100, directory=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_segment_that_cannot_be_reserved_leaves_no_file(tmp_path, monkeypatch):
    """A /dev/shm too small for the segment: posix_fallocate fails (rather than a SIGBUS at the
    first write past what tmpfs could give), and the half-made file is gone."""
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError, match="No space left"):
        SharedSegment.create(region_bytes=1 << 20, directory=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.multiprocess
@pytest.mark.parametrize("wire_dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("transport", ["shared_memory", "channel"])
def test_the_server_applies_each_push_exactly_through_either_transport(transport, wire_dtype):
    """Fully asynchronous, each push one step: the parameters coming back are the reference
    optimizer's after the same gradients (in bf16 on the wire: the gradients rounded to bf16 going,
    the parameters rounded to bf16 coming back, the server's own in fp32)."""
    bulk = {"fp32": torch.float32, "bf16": torch.bfloat16}[wire_dtype]
    with running_server(float("inf"), "delay", wire_dtype=wire_dtype, bulk_dtype=bulk) as (c0, c1, proc):
        if transport == "shared_memory":
            assert c0.attach_shared_memory(4) == c1.attach_shared_memory(4) == "shared_memory"
        _, optimizer = make_optimizer()
        assert c0.init(optimizer) == 4
        out0, out1 = torch.empty(4), torch.empty(4)
        g = [torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([-1.01, 0.51, 0.0, 2.0]), torch.tensor([0.3, 0.3, 0.3, 0.3])]
        rounded = [x.to(bulk).float() for x in g]
        c0.push(g[0], [0.1], out0)
        c1.push(g[1], [0.1], out1)
        torch.testing.assert_close(out1, reference_apply(rounded[:2]).to(bulk).float(), rtol=0, atol=0)
        c0.push(g[2], [0.1], out0)
        torch.testing.assert_close(out0, reference_apply(rounded).to(bulk).float(), rtol=0, atol=0)
        assert our_segments(proc.pid) == our_segments(os.getpid()) == []
    assert proc.returncode == 0


@pytest.mark.multiprocess
def test_no_room_in_shared_memory_falls_back_to_the_channel_with_one_warning(tmp_path, caplog):
    with running_server(float("inf"), "delay") as (c0, c1, _):
        with caplog.at_level(logging.WARNING, logger="lightning_hybrid.parameter_server.client"):
            assert c0.attach_shared_memory(4, directory=tmp_path / "missing") == "channel"
        (warning,) = caplog.records
        assert "no shared-memory segment of 128 bytes" in warning.getMessage()
        assert "--shm-size" in warning.getMessage()
        _, optimizer = make_optimizer()
        c0.init(optimizer)
        out = torch.empty(4)
        c0.push(torch.ones(4), [0.1], out)  # through the channel
        torch.testing.assert_close(out, reference_apply([torch.ones(4)]))


@pytest.mark.multiprocess
def test_a_worker_on_another_host_uses_the_channel_silently(tmp_path, caplog):
    """A segment the server cannot find in its /dev/shm (here: made in another folder) is a worker
    on another host: no warning, the channel carries its bulk."""
    with running_server(float("inf"), "delay") as (c0, c1, _):
        with caplog.at_level(logging.WARNING):
            assert c0.attach_shared_memory(4, directory=tmp_path) == "channel"
        assert caplog.records == []
        assert list(tmp_path.iterdir()) == [], "the worker removes the segment nobody mapped"
        _, optimizer = make_optimizer()
        c0.init(optimizer)
        out = torch.empty(4)
        c0.push(torch.ones(4), [0.1], out)
        torch.testing.assert_close(out, reference_apply([torch.ones(4)]))
