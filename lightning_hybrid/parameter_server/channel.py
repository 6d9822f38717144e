"""A side channel between the workers and the parameter server: a gloo process group of its own.

Lightning's default process group holds the workers only, so Lightning's and torchmetrics'
collectives never involve the server. The server and the workers additionally join a separate
gloo group built on the run's rendezvous store (``MASTER_ADDR:MASTER_PORT``, under a key prefix):
server rank 0, worker ``w`` rank ``w + 1``. It reaches across hosts exactly as the default group
does, so the same code runs on one box and on a cluster. It carries CPU tensors
(:data:`~lightning_hybrid.comm.collectives.SIDE_CHANNEL_DEVICE`) whatever the workers train on:
messages of :mod:`~lightning_hybrid.parameter_server.protocol` with their payloads, one buffer each
(:class:`Mailbox`). A worker on the server's host moves the bulk of its messages (gradients,
parameters) through a shared-memory segment instead
(:mod:`~lightning_hybrid.parameter_server.shared_memory`); the messages still go through here.
"""

from __future__ import annotations

import datetime
import io
import itertools
import pickle
import queue
import threading
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from lightning_hybrid.comm.board import connect_store
from lightning_hybrid.comm.collectives import SIDE_CHANNEL_DEVICE
from lightning_hybrid.parameter_server.protocol import (
    HEADER_LEN, TAG_REPLY, TAG_REPLY_PAYLOAD, TAG_REQUEST, TAG_REQUEST_PAYLOAD, Message, decode, encode,
)
from lightning_hybrid.parameter_server.shared_memory import SharedSegment


class ChannelClosedError(RuntimeError):
    """The other side of the channel is gone or did not answer in time."""


class WorkerLostError(ChannelClosedError):
    """The server's connection to ``worker`` broke (its process died) or it sent nothing in time."""

    def __init__(self, worker: int, cause: BaseException) -> None:
        super().__init__(f"worker {worker}: {cause}")
        self.worker = worker


def open_channel(host: str, port: int, prefix: str, rank: int, size: int, timeout_s: float) -> dist.ProcessGroup:
    """Join the side-channel group ``prefix`` as ``rank`` of ``size`` through the store at host:port."""
    store = connect_store(host, port, timeout_s)
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size, datetime.timedelta(seconds=timeout_s))


def send(pg: dist.ProcessGroup, tensor: torch.Tensor, dst: int, tag: int) -> None:
    """Send ``tensor`` (moved to the channel's device, the CPU, if it is elsewhere)."""
    pg.send([tensor.detach().to(SIDE_CHANNEL_DEVICE).contiguous()], dst, tag).wait()


def recv(pg: dist.ProcessGroup, tensor: torch.Tensor, src: int, tag: int) -> torch.Tensor:
    """Receive into ``tensor``, which must be a CPU tensor (the channel's device)."""
    if tensor.device != SIDE_CHANNEL_DEVICE:
        raise ValueError(f"the side channel receives into {SIDE_CHANNEL_DEVICE} tensors, got one on {tensor.device}")
    pg.recv([tensor], src, tag).wait()
    return tensor


#: Payload room every mailbox has beyond the parameters: learning rates of up to 64 parameter
#: groups and a batch of up to 65,536 sample indices travel in the message itself.
_SPARE = 8 * 64 + 8 * 65536
_HEADER_BYTES = 8 * HEADER_LEN


def capacity_for(num_params: int) -> int:
    """Bytes of the one-message buffer of a mailbox whose model has ``num_params`` parameters."""
    return _HEADER_BYTES + _SPARE + 4 * num_params


def _padded(nbytes: int) -> int:
    return -(-nbytes // 8) * 8


#: A bulk vector: one tensor, or tensors whose values, in order, make it up (a model's gradients or
#: parameters, written or read in place without a flat copy of their own).
Bulk = torch.Tensor | Sequence[torch.Tensor]


def bulk_numel(bulk: Bulk) -> int:
    """The values of a bulk vector."""
    return bulk.numel() if isinstance(bulk, torch.Tensor) else sum(t.numel() for t in bulk)


def fill(target: torch.Tensor, bulk: Bulk) -> None:
    """Copy ``bulk``'s values, in order, into the flat ``target`` (converting dtype and device)."""
    if isinstance(bulk, torch.Tensor):
        target.copy_(bulk.detach().reshape(-1))
        return
    offset = 0
    for piece in bulk:
        n = piece.numel()
        target[offset : offset + n].copy_(piece.detach().reshape(-1))
        offset += n


def spill(source: torch.Tensor, out: Bulk) -> None:
    """Copy the flat ``source``'s values, in order, into ``out`` (the inverse of :func:`fill`)."""
    if isinstance(out, torch.Tensor):
        out.copy_(source.view_as(out) if out.dim() > 1 else source)
        return
    offset = 0
    with torch.no_grad():
        for tensor in out:
            n = tensor.numel()
            tensor.copy_(source[offset : offset + n].view_as(tensor))
            offset += n


class Payload:
    """A received message's payload, read front to back (each tensor 8-byte aligned), and its bulk
    (:meth:`bulk`: last in the payload, or in the shared-memory region ``shared``). The tensors read
    are views of the mailbox's buffer or of the region, valid until the next message: copy what you keep."""

    def __init__(self, data: torch.Tensor, shared: tuple[SharedSegment, str] | None = None,
                 bulk_dtype: torch.dtype = torch.float32) -> None:
        self.data, self.offset = data, 0
        self.shared, self.bulk_dtype = shared, bulk_dtype

    def take(self, dtype: torch.dtype, count: int) -> torch.Tensor:
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        piece = self.data[self.offset : self.offset + nbytes].view(dtype)
        self.offset += _padded(nbytes)
        return piece

    def text(self, nbytes: int) -> str:
        """The next ``nbytes`` of the payload as UTF-8 text (see :func:`text_payload`)."""
        return bytes(self.take(torch.uint8, nbytes).tolist()).decode()

    def bulk(self, count: int) -> torch.Tensor:
        """The message's vector of the model's size (``count`` values of the wire's dtype)."""
        if self.shared is None:
            return self.take(self.bulk_dtype, count)
        segment, region = self.shared
        return segment.view(region, self.bulk_dtype, count)


class Mailbox:
    """One end of the side channel. A message's header and payload tensors travel packed into one
    buffer, one message each way per request (a message per tensor costs a wake-up of the other
    process each, which on busy cores is most of a round trip); a payload larger than the
    receiver's buffer (:func:`capacity_for` the model's size) follows in a second message.

    Both ends size their buffers from the parameter count they know (:meth:`grow`): the server at
    ``Init``, a worker from its own model. The bulk (:meth:`send`'s ``bulk``) travels in
    ``bulk_dtype``, in the message or, once :attr:`segment` is set (both ends of a worker's mailbox
    set it), through that shared-memory segment: a request's in its ``requests`` region, a reply's
    in ``replies``.
    """

    def __init__(self, pg: dist.ProcessGroup, num_params: int = 0, bulk_dtype: torch.dtype = torch.float32) -> None:
        self.pg = pg
        self.bulk_dtype = bulk_dtype
        self.segment: SharedSegment | None = None
        self._buffer = torch.empty(0, dtype=torch.uint8)
        self._outgoing = torch.empty(0, dtype=torch.uint8)  # reused: a send returns once gloo is done with it
        self.grow(num_params)

    @property
    def capacity(self) -> int:
        return self._buffer.numel()

    def grow(self, num_params: int) -> None:
        """Make room for messages of a model of ``num_params`` parameters (the other end does the same)."""
        if capacity_for(num_params) > self.capacity:
            self._buffer = torch.empty(capacity_for(num_params), dtype=torch.uint8)

    def _region(self, reply: bool) -> tuple[SharedSegment, str] | None:
        return None if self.segment is None else (self.segment, "replies" if reply else "requests")

    def send(self, message: Message, dst: int, payloads: Sequence[torch.Tensor] = (), reply: bool = False,
             bulk: Bulk | None = None) -> None:
        """Send ``message`` and its payload tensors to channel rank ``dst`` (a reply with ``reply``);
        ``bulk``, converted to :attr:`bulk_dtype`, after them or through the shared segment."""
        region = self._region(reply)
        if bulk is not None and region is not None:  # written before the message that says it is there
            fill(region[0].view(region[1], self.bulk_dtype, bulk_numel(bulk)), bulk)
            bulk = None
        parts = [t.detach().to(SIDE_CHANNEL_DEVICE).contiguous().view(-1).view(torch.uint8) for t in payloads]
        sizes = [_padded(p.numel()) for p in parts]
        if bulk is not None:
            sizes.append(_padded(bulk_numel(bulk) * torch.empty((), dtype=self.bulk_dtype).element_size()))
        total = sum(sizes)
        inline = _HEADER_BYTES + total <= self.capacity
        needed = _HEADER_BYTES + (total if inline else 0)
        if self._outgoing.numel() < needed:
            self._outgoing = torch.empty(needed, dtype=torch.uint8)
        packed = self._outgoing[:needed]
        packed[:_HEADER_BYTES] = encode(message, total, inline).view(torch.uint8)
        body = packed[_HEADER_BYTES:] if inline else torch.empty(total, dtype=torch.uint8)
        offset = 0
        for part, size in zip(parts, sizes):
            body[offset : offset + part.numel()] = part
            offset += size
        if bulk is not None:  # converted to the wire's dtype as it is copied in
            nbytes = bulk_numel(bulk) * torch.empty((), dtype=self.bulk_dtype).element_size()
            fill(body[offset : offset + nbytes].view(self.bulk_dtype), bulk)
        send(self.pg, packed, dst, TAG_REPLY if reply else TAG_REQUEST)
        if not inline:
            send(self.pg, body, dst, TAG_REPLY_PAYLOAD if reply else TAG_REQUEST_PAYLOAD)

    def receive(self, src: int, reply: bool = False) -> tuple[Message, Payload]:
        """The next request (or, with ``reply``, reply) from channel rank ``src``: ``(message, payload)``."""
        buffer = self._buffer  # grow() may replace it while this waits (the server's inbox threads)
        recv(self.pg, buffer, src, TAG_REPLY if reply else TAG_REQUEST)
        message, nbytes, inline = decode(buffer[:_HEADER_BYTES].view(torch.int64))
        if inline:
            data = buffer[_HEADER_BYTES : _HEADER_BYTES + nbytes]
        else:
            data = recv(self.pg, torch.empty(nbytes, dtype=torch.uint8), src, TAG_REPLY_PAYLOAD if reply else TAG_REQUEST_PAYLOAD)
        return message, Payload(data, self._region(reply), self.bulk_dtype)


class Inbox:
    """The server's end: a :class:`Mailbox` per worker, each received into by a thread of its own,
    so that a request arrives as one message from whichever worker sends (gloo's receive-from-any
    costs a round trip of its own for a large message), and the next receive is posted before the
    worker can send again (a message that finds no receive posted waits for one). A worker has one
    request outstanding at a time, so each mailbox alternates between two buffers: a payload stays
    valid while the request after it arrives."""

    def __init__(self, pg: dist.ProcessGroup, workers: int, num_params: int = 0,
                 bulk_dtype: torch.dtype = torch.float32) -> None:
        self.mailboxes = [Mailbox(pg, num_params, bulk_dtype) for _ in range(workers)]
        self._spares = [Mailbox(pg, num_params, bulk_dtype) for _ in range(workers)]  # the second buffer of each worker
        self._ready: queue.Queue[tuple[int, Message | None, Payload | BaseException]] = queue.Queue()
        for worker in range(workers):
            threading.Thread(target=self._listen, args=(worker,), daemon=True, name=f"ps-inbox-{worker}").start()

    def _listen(self, worker: int) -> None:
        boxes = (self.mailboxes[worker], self._spares[worker])
        for turn in itertools.count():
            try:
                message, payload = boxes[turn % 2].receive(worker + 1)
            except BaseException as err:  # the worker is gone: the server learns it from the queue
                self._ready.put((worker, None, err))
                return
            self._ready.put((worker, message, payload))

    def grow(self, num_params: int) -> None:
        """Room for a model of ``num_params`` parameters from the next receives on; a receive already
        posted keeps its buffer (size the inbox at construction when the model is known)."""
        for mailbox in (*self.mailboxes, *self._spares):
            mailbox.grow(num_params)

    def next(self, timeout: float | None = None) -> tuple[int, Message, Payload] | None:
        """The next request: ``(worker, message, payload)``, or None when ``timeout`` seconds pass
        first; a :class:`WorkerLostError` (from what broke it) when a worker's connection broke."""
        try:
            worker, message, payload = self._ready.get(timeout=timeout)
        except queue.Empty:
            return None
        if message is None:
            raise WorkerLostError(worker, payload) from payload
        return worker, message, payload

    def attach(self, worker: int, segment: SharedSegment) -> None:
        """From the next message on, ``worker``'s bulk travels through ``segment`` (both its buffers)."""
        self.mailboxes[worker].segment = self._spares[worker].segment = segment

    def send(self, message: Message, worker: int, payloads: Sequence[torch.Tensor] = (),
             bulk: Bulk | None = None) -> None:
        self.mailboxes[worker].send(message, worker + 1, payloads, reply=True, bulk=bulk)


def text_payload(text: str) -> torch.Tensor:
    """``text`` as a uint8 payload tensor (its length is the message's ``nbytes``; :meth:`Payload.text` reads it)."""
    return torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8)


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
