"""A side channel between the workers and the parameter server: a gloo process group of its own.

Lightning's default process group holds the workers only, so Lightning's and torchmetrics'
collectives never involve the server. The server and the workers additionally join a separate
gloo group built on the run's rendezvous store (``MASTER_ADDR:MASTER_PORT``, under a key prefix):
server rank 0, worker ``w`` rank ``w + 1``. It reaches across hosts exactly as the default group
does, so the same code runs on one box and on a cluster. Messages are a fixed-size int64 header
followed by an optional payload tensor.
"""

from __future__ import annotations

import datetime
import io
import pickle
from enum import IntEnum
from typing import Any

import torch
import torch.distributed as dist

from lightning_hybrid.comm.collectives import SIDE_CHANNEL_DEVICE

HEADER_LEN = 8
TAG_REQUEST, TAG_REQUEST_PAYLOAD, TAG_REPLY, TAG_REPLY_PAYLOAD = 11, 12, 13, 14


class Op(IntEnum):
    INIT = 1  # worker 0 -> server: run configuration, optimizer (pickled)
    CHUNK = 2  # next batch of sample indices for this epoch
    PUSH = 3  # a gradient (and the learning rates); the reply is the newest parameters
    FINISH = 4  # no more data this epoch; the reply comes at the global synchronization
    STATE = 5  # the server's optimizer state (pickled)
    SHUTDOWN = 6
    ERROR = 7  # server -> worker: the request failed; payload is the message


class ChannelClosedError(RuntimeError):
    """The other side of the channel is gone or did not answer in time."""


def open_channel(host: str, port: int, prefix: str, rank: int, size: int, timeout_s: float) -> dist.ProcessGroup:
    """Join the side-channel group ``prefix`` as ``rank`` of ``size`` through the store at host:port."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size, timeout)


def header(op: int, *fields: int) -> torch.Tensor:
    values = [int(op), *[int(f) for f in fields]]
    if len(values) > HEADER_LEN:
        raise ValueError(f"header holds {HEADER_LEN} fields, got {len(values)}")
    return torch.tensor(values + [0] * (HEADER_LEN - len(values)), dtype=torch.int64)


def send(pg: dist.ProcessGroup, tensor: torch.Tensor, dst: int, tag: int) -> None:
    """Send ``tensor`` (moved to the channel's device, the CPU, if it is elsewhere)."""
    pg.send([tensor.detach().to(SIDE_CHANNEL_DEVICE).contiguous()], dst, tag).wait()


def recv(pg: dist.ProcessGroup, tensor: torch.Tensor, src: int, tag: int) -> torch.Tensor:
    """Receive into ``tensor``, which must be a CPU tensor (the channel's device)."""
    if tensor.device != SIDE_CHANNEL_DEVICE:
        raise ValueError(f"the side channel receives into {SIDE_CHANNEL_DEVICE} tensors, got one on {tensor.device}")
    pg.recv([tensor], src, tag).wait()
    return tensor


def recv_any(pg: dist.ProcessGroup, tensor: torch.Tensor, tag: int) -> int:
    """Receive into ``tensor`` from whichever rank sends first; return that rank."""
    work = pg.recv_anysource([tensor], tag)
    work.wait()
    return work._source_rank()


def to_bytes(obj: Any) -> torch.Tensor:
    """Serialize ``obj`` (tensors saved device-independently) into a uint8 tensor."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def from_bytes(data: torch.Tensor) -> Any:
    """Inverse of :func:`to_bytes`; tensors land on the CPU."""
    try:
        return torch.load(io.BytesIO(data.numpy().tobytes()), map_location="cpu", weights_only=False)
    except (AttributeError, ModuleNotFoundError, pickle.UnpicklingError) as err:
        raise RuntimeError(
            f"the parameter server could not rebuild an object the workers sent ({err}). Optimizers, LR "
            "schedulers and their arguments must be importable by module path: define custom classes in a "
            "module rather than in the script's __main__, and use named functions instead of lambdas."
        ) from err
