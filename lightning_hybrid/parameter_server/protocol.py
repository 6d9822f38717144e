"""The parameter server's wire protocol: typed requests and replies, and the server's settings.

A message is a fixed-size int64 header (the message's op code, its fields, the size of its
payload) and the payload tensors its fields describe, packed into one buffer and sent as one
message over the side channel (:mod:`~lightning_hybrid.parameter_server.channel`; a payload larger
than the receiver's buffer follows in a second message). Every message is a frozen dataclass of
ints; :func:`encode` and :func:`decode` turn one into a header and back, so neither end handles op
codes or field positions. What each request does is described in :mod:`~lightning_hybrid.parameter_server.server`.

Requests (worker -> server) and the reply each gets:

=================  ==========================================  ==================================
request            payloads after the header                   reply
=================  ==========================================  ==================================
:class:`Init`      the pickled optimizer (uint8, ``nbytes``)   :class:`Initialized`
:class:`Attach`    the segment's name (uint8, ``name_len``)    :class:`Attached`
:class:`NextChunk`                                             :class:`Chunk` (+ int64 indices)
:class:`Push`      hyperparameters and the clip (float64),     :class:`Parameters` (+ the next
                   which tensors had a gradient (uint8,        chunk if asked for, + parameters:
                   ``tensors``; none when all had one), the    bulk)
                   gradient (bulk, ``numel`` values)
:class:`Finish`                                                :class:`Parameters` (+ parameters:
                                                               bulk),
                                                               at the epoch's global synchronization
:class:`GetState`                                              :class:`State` (+ pickled state)
:class:`Shutdown`                                              :class:`Bye` (the server's load)
:class:`StopRun`                                               :class:`Stopping`
:class:`Leave`                                                 :class:`Stopping`
=================  ==========================================  ==================================

Once a worker has sent ``StopRun`` (it was asked to stop by a signal), the server answers every
request at once, the ones it holds included, with ``stop`` = :data:`STOPPED_BY_SIGNAL` + the signal
(``Parameters``, ``Chunk``), so that every worker stops at its next exchange with it; each worker then
sends ``Leave``, and the server exits once all have.

Any request may instead be answered by :class:`Refused` (+ the message, uint8).

The bulk: a vector of the model's size in the wire's dtype (:data:`WIRE_DTYPES`: float32, or
bfloat16 with ``wire_dtype="bf16"``; the server keeps float32 weights and optimizer state). It
travels last in the message, or, once the worker has attached a shared-memory segment
(:mod:`~lightning_hybrid.parameter_server.shared_memory`), in that segment: the message then only
says that it is there.

The server's settings (:class:`ServerSettings`) reach the server process as JSON on its standard
input, not as command-line strings.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import ClassVar

import torch

from lightning_hybrid.parameter_server.load import ServerLoad
from lightning_hybrid.parameter_server.sync_controller import validate_staleness

#: int64 slots of a header: the op code, up to :data:`MAX_FIELDS` fields, then the payload's bytes and
#: whether the payload came in the same message (1) or follows in a message of its own (0).
HEADER_LEN = 13
#: ``Parameters.stop`` / ``Chunk.stop`` of a run stopped by a signal: this plus the signal's number.
STOPPED_BY_SIGNAL = 100
MAX_FIELDS = HEADER_LEN - 3
TAG_REQUEST, TAG_REQUEST_PAYLOAD, TAG_REPLY, TAG_REPLY_PAYLOAD = 11, 12, 13, 14


@dataclass(frozen=True)
class Message:
    """A header's fields, all ints; subclasses set ``op``."""

    op: ClassVar[int] = 0


# ---------------------------------------------------------------------- requests
@dataclass(frozen=True)
class Init(Message):
    """Worker 0, once per fit: the user's optimizer with the parameters it holds (pickled)."""

    op: ClassVar[int] = 1
    nbytes: int


@dataclass(frozen=True)
class DatasetShape:
    """What the server needs to deal an epoch: sizes, the shuffle seed (or no shuffle: the training
    DataLoader's sampler was sequential, as ``overfit_batches`` makes it), a cap on batches, and
    the epoch's segments: ``segment_chunks`` batches each, with a global synchronization between
    them (``val_check_interval``; 0: the epoch is one segment)."""

    num_samples: int
    batch_size: int
    drop_last: bool = False
    max_chunks: int | None = None
    seed: int = 0
    shuffle: bool = True
    segment_chunks: int = 0


@dataclass(frozen=True)
class NextChunk(Message):
    """The next batch of sample indices of ``epoch`` (the first request describes the dataset)."""

    op: ClassVar[int] = 2
    epoch: int
    num_samples: int
    batch_size: int
    drop_last: int
    max_chunks: int  # -1: no cap
    seed: int
    shuffle: int
    segment_chunks: int = 0

    @classmethod
    def of(cls, epoch: int, dataset: DatasetShape) -> NextChunk:
        cap = -1 if dataset.max_chunks is None else dataset.max_chunks
        return cls(epoch, dataset.num_samples, dataset.batch_size, int(dataset.drop_last), cap, dataset.seed,
                   int(dataset.shuffle), dataset.segment_chunks)

    @property
    def dataset(self) -> DatasetShape:
        cap = None if self.max_chunks < 0 else self.max_chunks
        return DatasetShape(self.num_samples, self.batch_size, bool(self.drop_last), cap, self.seed, bool(self.shuffle),
                            self.segment_chunks)


@dataclass(frozen=True)
class Push(Message):
    """A gradient and the hyperparameters of the worker's parameter groups. ``hyperparameters`` float64
    values follow the header: every number of each group in the order of the layout whose fingerprint is
    ``layout`` (:mod:`~lightning_hybrid.parameter_server.hyperparameters`; the server sets them before its
    step), or, with ``layout`` 0, each group's learning rate; then, with ``clip`` 1, how the worker's step
    clips its gradient (three float64: :mod:`~lightning_hybrid.parameter_server.average_clip`), which the
    server applies to the average it steps with, as DDP clips the average. With ``chunk_epoch >= 0`` the
    worker's next batch of that epoch comes back with the parameters. ``weight``: what the
    gradient stands for when a round is averaged (1 per mini-batch, or samples summed in batch mode).
    ``read_version``: the step of the parameters the gradient was computed at, when the worker
    already holds newer ones (it pushes while it computes: the staleness counts from there).
    ``tensors``: when some of the worker's parameter tensors (of this server's shard) had no gradient
    (``.grad`` None: frozen, or unused), a mask of that many uint8 follows the float64 values, 1 where
    the tensor had one; the server steps only the tensors that had a gradient in some push of the step,
    as DDP does (:mod:`~lightning_hybrid.parameter_server.gradient_mask`). 0: no mask, every tensor had one."""

    op: ClassVar[int] = 3
    hyperparameters: int
    numel: int
    chunk_epoch: int = -1
    weight: int = 1
    read_version: int = -1  # the server step the gradient was computed at; -1: the last one sent
    batches: int = 1  # the dealt batches this gradient was computed on (gradient accumulation: several)
    shares: int = 0  # batch mode: the lost workers' shares this sum covers, asked for by Parameters.adopt (0: own pass)
    tensors: int = 0  # the length of the mask of tensors with a gradient that follows the float64 values (0: none, all had one)
    layout: int = 0  # the fingerprint of the hyperparameters' layout; 0: each group's learning rate
    clip: int = 0  # 1: the step's clip follows the hyperparameters


@dataclass(frozen=True)
class Finish(Message):
    """This worker's data of the epoch ran out; the reply comes at the epoch's global synchronization."""

    op: ClassVar[int] = 4


@dataclass(frozen=True)
class GetState(Message):
    """The server's optimizer state dict (for checkpoints)."""

    op: ClassVar[int] = 5


@dataclass(frozen=True)
class Shutdown(Message):
    op: ClassVar[int] = 6


@dataclass(frozen=True)
class StopRun(Message):
    """This worker was asked to stop (by signal ``signum``): every worker stops (see the module docstring)."""

    op: ClassVar[int] = 15
    signum: int


@dataclass(frozen=True)
class Leave(Message):
    """This worker stopped on a signal and leaves; the server exits once every worker has."""

    op: ClassVar[int] = 16


@dataclass(frozen=True)
class Attach(Message):
    """From here on, this worker's bulk travels through the shared-memory segment whose name follows:
    two regions of ``region_bytes`` each (:mod:`~lightning_hybrid.parameter_server.shared_memory`)."""

    op: ClassVar[int] = 13
    region_bytes: int
    name_len: int


# ---------------------------------------------------------------------- replies
@dataclass(frozen=True)
class Refused(Message):
    """The request failed on the server; the payload is the message (uint8)."""

    op: ClassVar[int] = 7
    nbytes: int


@dataclass(frozen=True)
class Initialized(Message):
    op: ClassVar[int] = 8
    num_params: int


@dataclass(frozen=True)
class Chunk(Message):
    """``length`` sample indices follow (int64); 0: the epoch has no batch left for this worker.
    ``segment``: the epoch's segment the batch belongs to (see :class:`DatasetShape`)."""

    op: ClassVar[int] = 9
    length: int
    segment: int = 0
    stop: int = 0  # STOPPED_BY_SIGNAL + the signal, when a worker stopped the run


@dataclass(frozen=True)
class Parameters(Message):
    """When ``chunk > 0`` the next batch's indices follow, then the newest parameters (the bulk).

    ``chunk``: the length of that batch, -1 when one was asked for but the epoch is over, 0 when
    none was asked for."""

    op: ClassVar[int] = 10
    version: int  # optimizer steps the server has taken
    staleness: int  # steps taken between this worker's read and the arrival of its gradient
    gap: int  # iterations this worker is ahead of the slowest active one, as it starts the next
    max_gap: int  # the largest gap recorded so far
    global_syncs: int  # delay-mode synchronizations (or BSP rounds) so far
    chunk: int = 0
    stop: int = 0  # the server has taken its max_steps steps, train no further: 1 at an epoch's end, 2 inside one;
    # STOPPED_BY_SIGNAL + a signal: a worker stopped the run
    live: int = 0  # the workers not lost, a bit each (worker w: 1 << w)
    adopt: int = 0  # batch mode: not released yet; push the gradient sum over these lost workers' shares first
    chunk_segment: int = 0  # the epoch's segment the batch that follows belongs to


@dataclass(frozen=True)
class State(Message):
    op: ClassVar[int] = 11
    nbytes: int


@dataclass(frozen=True)
class Stopping(Message):
    """The answer to ``StopRun`` and ``Leave``: the signal the run stops on."""

    op: ClassVar[int] = 17
    signum: int


@dataclass(frozen=True)
class Bye(Message):
    """The reply to ``Shutdown``: the server's load over the fit (see
    :class:`~lightning_hybrid.parameter_server.load.ServerLoad`; times in microseconds)."""

    op: ClassVar[int] = 12
    pushes: int = 0
    steps: int = 0
    wall_us: int = 0
    busy_us: int = 0
    cpu_us: int = 0

    @classmethod
    def of(cls, load: ServerLoad) -> Bye:
        return cls(load.pushes, load.steps, round(1e6 * load.wall_s), round(1e6 * load.busy_s), round(1e6 * load.cpu_s))

    @property
    def load(self) -> ServerLoad:
        return ServerLoad(self.pushes, self.steps, self.wall_us / 1e6, self.busy_us / 1e6, self.cpu_us / 1e6)


#: :class:`Attached` statuses: the server mapped the segment; it has no such segment (the worker
#: runs on another host, or in another /dev/shm); it failed to map it.
ATTACHED, NOT_ON_THIS_HOST, ATTACH_FAILED = 1, 0, -1


@dataclass(frozen=True)
class Attached(Message):
    """The answer to :class:`Attach`: ``status`` (:data:`ATTACHED` or why not, then the error's
    text follows, ``nbytes``); only with :data:`ATTACHED` does the bulk go through the segment."""

    op: ClassVar[int] = 14
    status: int
    nbytes: int = 0


MESSAGES: dict[int, type[Message]] = {
    cls.op: cls for cls in (Init, NextChunk, Push, Finish, GetState, Shutdown, Refused, Initialized, Chunk, Parameters,
                            State, Bye, Attach, Attached, StopRun, Leave, Stopping)
}


def encode(message: Message, payload_bytes: int = 0, inline: bool = True) -> torch.Tensor:
    """The header of ``message``: its op code, its fields in order, zero-padded, then the size of
    its payload and whether the payload is in the same message."""
    values = [message.op, *(int(getattr(message, f.name)) for f in fields(message))]
    if len(values) > 1 + MAX_FIELDS:
        raise ValueError(f"{type(message).__name__} has {len(values) - 1} fields; a header holds {MAX_FIELDS}")
    values += [0] * (1 + MAX_FIELDS - len(values))
    return torch.tensor(values + [payload_bytes, int(inline)], dtype=torch.int64)


def decode(header: torch.Tensor) -> tuple[Message, int, bool]:
    """``(message, payload bytes, payload inline)`` from a header (a ValueError for an unknown op code)."""
    values = header.tolist()
    cls = MESSAGES.get(values[0])
    if cls is None:
        raise ValueError(f"unknown parameter-server message op {values[0]}")
    return cls(*values[1 : 1 + len(fields(cls))]), values[-2], bool(values[-1])


# ---------------------------------------------------------------------- the bulk's dtype on the wire
#: What ``wire_dtype`` may be: the dtype gradients and parameters travel in.
WIRE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def wire_dtype(name: str) -> torch.dtype:
    """The torch dtype of the wire dtype ``name`` (a ValueError naming the choices otherwise)."""
    if name not in WIRE_DTYPES:
        raise ValueError(
            f"wire_dtype must be one of {', '.join(map(repr, WIRE_DTYPES))} (the dtype gradients and parameters travel "
            f"in; the server keeps float32), got {name!r}"
        )
    return WIRE_DTYPES[name]


def check_server_device(name: str) -> str:
    """``name`` if it names a device the server can run on ("cpu", "cuda", "cuda:N"), else a ValueError."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"server_device must be 'cpu', 'cuda' or 'cuda:N', got {name!r}") from err
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"server_device must be 'cpu', 'cuda' or 'cuda:N', got {name!r}")
    return name


# ---------------------------------------------------------------------- the server's settings
#: What a lost worker does to the run: end it (the default), or leave its work to the others.
WORKER_FAILURE_MODES = ("stop", "continue")


@dataclass(frozen=True)
class ServerSettings:
    """Everything the server process needs, handed to it as data (JSON on its standard input).

    Args:
        host, port: the run's rendezvous store (``MASTER_ADDR``/``MASTER_PORT``).
        prefix: the side channel's key prefix in that store (one per fit).
        workers: worker processes (the channel has one rank more: the server's).
        staleness: iterations the fastest worker may lead the slowest (``inf``: never wait).
        sync: ``"delay"`` or ``"bounded"`` (see :mod:`~lightning_hybrid.parameter_server.sync_controller`).
        timeout: seconds the server waits for a worker before failing.
        pushes_per_update, staleness_lr, momentum_correction, restart_steps: the update rule
            (:class:`~lightning_hybrid.parameter_server.update_rule.UpdateRule`; staleness > 0 only).
        max_steps: optimizer steps after which the server stops the run (-1: no limit); pushes
            after the last step are not applied.
        step_patience: how long a push that does not complete an update may wait for it, as a
            fraction of the worker's cycle, its waits for the server excluded
            (:mod:`~lightning_hybrid.parameter_server.step_wait`).
        pushes_follow_workers: ``pushes_per_update`` is one per live worker (it drops when a worker is lost).
        on_worker_failure: ``"stop"``: a lost worker ends the server with an error; ``"continue"``: its
            unfinished batches go to the others and the run goes on without it.
        batch_mode: each worker's push is the sum over its whole share of the data (cNeural); a lost
            worker's share is then computed by its adopter (:mod:`~lightning_hybrid.parameter_server.adoption`).
        num_params: the parameters the workers will push, when known: the server's receive buffers
            are sized for them from the start (0: at ``Init``; a receive posted before ``Init`` was
            handled then fits a model of about 131,000 parameters at most).
        wire_dtype: the dtype gradients and parameters travel in (:data:`WIRE_DTYPES`).
        server_device: where the server keeps the parameters and runs the optimizer ("cpu",
            "cuda", "cuda:N"); gradients and parameters still travel through host memory.
        shard, shards: this server is shard ``shard`` of ``shards``
            (:mod:`~lightning_hybrid.parameter_server.sharding`; it holds ``num_params`` of them).
        run_prefix: with several shards, the key prefix under which they meet on the run's store (each
            clipped step's gradient norm: :mod:`~lightning_hybrid.parameter_server.average_clip`).
    """

    host: str
    port: int
    prefix: str
    workers: int
    staleness: float
    sync: str = "delay"
    timeout: float = 1800.0
    pushes_per_update: int = 1
    staleness_lr: bool = False
    momentum_correction: bool | str = False
    restart_steps: int = 0
    max_steps: int = -1
    step_patience: float = 0.0
    pushes_follow_workers: bool = False
    on_worker_failure: str = "stop"
    batch_mode: bool = False
    num_params: int = 0
    wire_dtype: str = "fp32"
    shard: int = 0
    shards: int = 1
    server_device: str = "cpu"
    run_prefix: str = ""

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"the parameter server needs at least one worker, got {self.workers}")
        validate_staleness(self.staleness, self.sync)
        if self.on_worker_failure not in WORKER_FAILURE_MODES:
            raise ValueError(
                f"on_worker_failure must be one of {', '.join(map(repr, WORKER_FAILURE_MODES))}, got {self.on_worker_failure!r}"
            )
        wire_dtype(self.wire_dtype)
        check_server_device(self.server_device)
        if not 0 <= self.shard < self.shards:
            raise ValueError(f"shard {self.shard} of {self.shards}: shards are numbered from 0")
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(f"max_steps must be a positive number of optimizer steps or -1, got {self.max_steps}")

    @property
    def name(self) -> str:
        """What the server is called in messages: "parameter server", or "parameter server shard i"."""
        return "parameter server" if self.shards == 1 else f"parameter server shard {self.shard}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))  # inf is written as Infinity, which json reads back

    @classmethod
    def from_json(cls, text: str) -> ServerSettings:
        return cls(**json.loads(text))
