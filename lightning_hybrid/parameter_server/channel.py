"""A side channel between the workers and the parameter server: a gloo process group of its own.

Lightning's default process group holds the workers only, so Lightning's and torchmetrics'
collectives never involve the server. The server and the workers additionally join a separate
gloo group built on the run's rendezvous store (``MASTER_ADDR:MASTER_PORT``, under a key prefix):
server rank 0, worker ``w`` rank ``w + 1``. It reaches across hosts exactly as the default group
does, so the same code runs on one box and on a cluster. It carries CPU tensors
(:data:`~lightning_hybrid.comm.collectives.SIDE_CHANNEL_DEVICE`) whatever the workers train on:
messages of :mod:`~lightning_hybrid.parameter_server.protocol` and their payloads.
"""

from __future__ import annotations

import datetime
import io
import pickle
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from lightning_hybrid.comm.collectives import SIDE_CHANNEL_DEVICE
from lightning_hybrid.parameter_server.protocol import (
    HEADER_LEN, TAG_REPLY, TAG_REPLY_PAYLOAD, TAG_REQUEST, TAG_REQUEST_PAYLOAD, Message, decode, encode,
)


class ChannelClosedError(RuntimeError):
    """The other side of the channel is gone or did not answer in time."""


def open_channel(host: str, port: int, prefix: str, rank: int, size: int, timeout_s: float) -> dist.ProcessGroup:
    """Join the side-channel group ``prefix`` as ``rank`` of ``size`` through the store at host:port."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size, timeout)


def send(pg: dist.ProcessGroup, tensor: torch.Tensor, dst: int, tag: int) -> None:
    """Send ``tensor`` (moved to the channel's device, the CPU, if it is elsewhere)."""
    pg.send([tensor.detach().to(SIDE_CHANNEL_DEVICE).contiguous()], dst, tag).wait()


def recv(pg: dist.ProcessGroup, tensor: torch.Tensor, src: int, tag: int) -> torch.Tensor:
    """Receive into ``tensor``, which must be a CPU tensor (the channel's device)."""
    if tensor.device != SIDE_CHANNEL_DEVICE:
        raise ValueError(f"the side channel receives into {SIDE_CHANNEL_DEVICE} tensors, got one on {tensor.device}")
    pg.recv([tensor], src, tag).wait()
    return tensor


def send_message(pg: dist.ProcessGroup, message: Message, dst: int, payloads: Sequence[torch.Tensor] = (),
                 reply: bool = False) -> None:
    """Send a request (or, with ``reply``, a reply) and its payloads to channel rank ``dst``."""
    send(pg, encode(message), dst, TAG_REPLY if reply else TAG_REQUEST)
    for payload in payloads:
        send(pg, payload, dst, TAG_REPLY_PAYLOAD if reply else TAG_REQUEST_PAYLOAD)


def receive_reply(pg: dist.ProcessGroup, src: int) -> Message:
    header = torch.empty(HEADER_LEN, dtype=torch.int64)
    return decode(recv(pg, header, src, TAG_REPLY))


def receive_request(pg: dist.ProcessGroup) -> tuple[int, Message]:
    """The next request from whichever rank sends first: ``(that rank, the request)``."""
    header = torch.empty(HEADER_LEN, dtype=torch.int64)
    work = pg.recv_anysource([header], TAG_REQUEST)
    work.wait()
    return work._source_rank(), decode(header)


def receive_payload(pg: dist.ProcessGroup, tensor: torch.Tensor, src: int, reply: bool) -> torch.Tensor:
    """Receive a payload of a request (or, with ``reply``, of a reply) into ``tensor``."""
    return recv(pg, tensor, src, TAG_REPLY_PAYLOAD if reply else TAG_REQUEST_PAYLOAD)


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
