"""Which device each process group's tensors live on, and every collective the package issues.

A process group serves tensors of one kind of device: NCCL only CUDA tensors (a CPU tensor fails
with "No backend type associated with device type cpu"), gloo CPU tensors (some of its collectives
also take CUDA tensors, its point-to-point messages do not), and the parameter server's side
channel is a gloo group of CPU tensors whatever the workers train on. :func:`group_device` is the
one place that decides, from the group's backend; the functions below move a tensor to that device
when it is elsewhere, run the collective, and hand the result back on the tensor's own device. The
rest of the package calls these, never ``torch.distributed``'s collectives directly (a test checks
this), so no collective guesses a device on its own.

Ranks are global ranks, as in ``torch.distributed``; ``group=None`` is the default group.

Example (inside an initialized process group)::

    >>> stats = torch.tensor([1.0, 2.0], dtype=torch.float64)       # doctest: +SKIP
    >>> everyone = all_gather(stats)                              # doctest: +SKIP
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from lightning_hybrid.comm.flat import copy_into, flatten

#: The parameter server's side channel (:mod:`lightning_hybrid.comm.channel`) carries CPU tensors.
SIDE_CHANNEL_DEVICE = torch.device("cpu")


def group_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """The device ``group``'s collectives take tensors on: this rank's CUDA device for a group with
    an NCCL backend, the CPU for any other (gloo, mpi)."""
    if "nccl" in str(dist.get_backend(group)):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def unchecked_group(backend: str = "gloo") -> dist.ProcessGroup:
    """A new group of every rank (a collective call) that torch's collective check does not wrap where
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` is set (elsewhere: a plain new group). The check runs before
    each collective of a group and waits for every rank to reach it, so a collective meant to run in
    the background, overlapping the ranks' compute (a deferred agreement), would become a
    synchronization point under it; and DDP's constructor crashes on it (:func:`ddp_group`)."""
    if dist.get_debug_level() != dist.DebugLevel.DETAIL:
        return dist.new_group(backend=backend)
    dist.set_debug_level(dist.DebugLevel.OFF)  # read when a group is made: this one gets no checker
    try:
        return dist.new_group(backend=backend)
    finally:
        dist.set_debug_level(dist.DebugLevel.DETAIL)


_ddp_groups: list[tuple[dist.ProcessGroup, dist.ProcessGroup]] = []  # (default group, DDP's group)


def ddp_group() -> dist.ProcessGroup | None:
    """The group ``DistributedDataParallel`` reduces over: the default group (``None``), except where
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` wraps the default gloo group in torch's collective checker.
    DDP's constructor then crashes the process (torch 2.13: ``c10d::Logger::set_env_variables`` reads
    the checker as a gloo group; a segmentation fault), so DDP gets an :func:`unchecked_group`: DDP's
    own all-reduces go unchecked, every other collective stays checked. A collective call (every rank
    calls it, once per default group, at the same point)."""
    if dist.get_debug_level() != dist.DebugLevel.DETAIL or dist.get_backend() != "gloo":
        return None
    world = dist.group.WORLD
    for default, group in _ddp_groups:
        if default is world:
            return group
    group = unchecked_group()
    _ddp_groups[:] = [(world, group)]  # an earlier default group is gone
    return group


def _staged(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` itself when it is contiguous on ``device``, else a contiguous copy there."""
    if tensor.device == device and tensor.is_contiguous():
        return tensor
    return tensor.detach().to(device).contiguous()


def _copy_back(result: torch.Tensor, into: torch.Tensor) -> torch.Tensor:
    if result is not into:
        with torch.no_grad():
            into.copy_(result)
    return into


def all_reduce_(tensor: torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Reduce ``tensor`` across the group in place; return it."""
    staged = _staged(tensor, group_device(group))
    dist.all_reduce(staged, op=op, group=group)
    return _copy_back(staged, tensor)


def broadcast_(tensor: torch.Tensor, src: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Overwrite ``tensor`` with global rank ``src``'s in place; return it."""
    staged = _staged(tensor, group_device(group))
    dist.broadcast(staged, src=src, group=group)
    return _copy_back(staged, tensor)


def all_gather(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (same shape and dtype on all ranks), in group rank order, on ``tensor``'s device."""
    staged = _staged(tensor, group_device(group))
    gathered = [torch.empty_like(staged) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, staged, group=group)
    return [t.to(tensor.device) for t in gathered]


def all_gather_object(obj: Any, group: dist.ProcessGroup | None = None) -> list[Any]:
    """Every rank's picklable ``obj``, in group rank order."""
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, obj, group=group)
    return gathered


def gather_object(obj: Any, dst: int, group: dist.ProcessGroup | None = None) -> list[Any] | None:
    """Every rank's picklable ``obj``, in group rank order, on global rank ``dst`` alone (None elsewhere)."""
    gathered: list[Any] | None = [None] * dist.get_world_size(group) if dist.get_rank() == dst else None
    dist.gather_object(obj, gathered, dst=dst, group=group)
    return gathered


def broadcast_module_(module: torch.nn.Module, src: int, group: dist.ProcessGroup | None = None) -> None:
    """Every rank takes global rank ``src``'s parameters and buffers of ``module`` (what DDP's wrapper does
    when it wraps a module): one broadcast per dtype and device. Tensors on the meta device are left out."""
    kinds: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        if tensor.device.type != "meta" and tensor.numel():
            kinds.setdefault((tensor.dtype, tensor.device), []).append(tensor)
    for tensors in kinds.values():
        flat = flatten(tensors)
        broadcast_(flat, src=src, group=group)
        copy_into(flat, tensors)


def broadcast_object(obj: Any, src: int, group: dist.ProcessGroup | None = None) -> Any:
    """Global rank ``src``'s picklable ``obj`` on every rank (the others pass anything, e.g. None)."""
    holder = [obj]
    dist.broadcast_object_list(holder, src=src, group=group)
    return holder[0]


def send_object(obj: Any, dst: int, group: dist.ProcessGroup | None = None) -> None:
    """Send picklable ``obj`` to global rank ``dst`` alone (which calls :func:`receive_object`)."""
    dist.send_object_list([obj], dst=dst, group=group, device=group_device(group))


def receive_object(src: int, group: dist.ProcessGroup | None = None) -> Any:
    """The object global rank ``src`` sent with :func:`send_object`."""
    holder: list[Any] = [None]
    dist.recv_object_list(holder, src=src, group=group, device=group_device(group))
    return holder[0]


def wait_in_pieces(work: dist.Work, while_waiting: Callable[[], None], every_s: float = 1.0) -> None:
    """Wait for a gloo collective ``every_s`` seconds at a time, calling ``while_waiting()`` between the
    pieces (it may raise, to give up on a collective the other ranks will not join): a wait that a
    plain ``work.wait()`` would make endless (a rank whose peers went elsewhere) ends with the caller's
    error instead. A gloo work that timed out keeps running and can be waited for again."""
    piece = datetime.timedelta(seconds=every_s)
    while True:
        try:
            work.wait(timeout=piece)
            return
        except RuntimeError as err:
            if "not implemented" in str(err):  # a work wrapping a future (a simulated latency's): polled
                break
            if "timed out" not in str(err).lower():
                raise
        while_waiting()
    while True:
        deadline = time.monotonic() + every_s
        while not work.is_completed():
            if time.monotonic() >= deadline:
                break
            time.sleep(0.001)
        else:
            work.wait()
            return
        while_waiting()


class Pending:
    """A collective started in the background (:func:`start_all_reduce`, :func:`start_broadcast`);
    :meth:`wait` returns its result in the tensor it was started on, on that tensor's device."""

    def __init__(self, work: dist.Work, staged: torch.Tensor, into: torch.Tensor) -> None:
        self._work, self._staged, self._into = work, staged, into

    def wait(self, while_waiting: Callable[[], None] | None = None) -> torch.Tensor:
        """The result, once the collective is complete. ``while_waiting``: called about every second
        while this rank waits for it on a CPU (gloo) group (:func:`wait_in_pieces`); on a GPU the
        host does not wait here (NCCL orders the streams)."""
        if while_waiting is None or self._staged.device.type != "cpu":
            self._work.wait()
        else:
            wait_in_pieces(self._work, while_waiting)
        return _copy_back(self._staged, self._into)


def start_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                     op: dist.ReduceOp = dist.ReduceOp.SUM) -> Pending:
    """Start reducing ``tensor`` across the group (a sum unless ``op`` says otherwise) in the background."""
    staged = _staged(tensor, group_device(group))
    return Pending(dist.all_reduce(staged, op=op, group=group, async_op=True), staged, tensor)


def start_broadcast(tensor: torch.Tensor, src: int, group: dist.ProcessGroup | None = None) -> Pending:
    """Start overwriting ``tensor`` with global rank ``src``'s in the background."""
    staged = _staged(tensor, group_device(group))
    return Pending(dist.broadcast(staged, src=src, group=group, async_op=True), staged, tensor)


def all_reduce_future(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.futures.Future[torch.Tensor]:
    """Start summing ``tensor`` across the group; the future's value is ``tensor`` itself, reduced (what
    a DDP communication hook returns for its bucket)."""
    staged = _staged(tensor, group_device(group))
    started = dist.all_reduce(staged, group=group, async_op=True).get_future()
    return started.then(lambda done: _copy_back(done.value()[0], tensor))


def bf16_wire_hook(state, bucket):  # noqa: ANN001, ANN201 (DDP checks the annotations, as objects)
    """A DDP communication hook: each gradient bucket (``dist.GradBucket``) travels in bf16 (half the
    bytes of fp32) and is averaged there, on any backend (torch's own ``bf16_compress_hook`` refuses
    anything but NCCL and CUDA, by its name). ``state``: the process group (None: the default one). Returns the
    future of the bucket's averaged buffer."""
    group = state if state is not None else dist.group.WORLD
    buffer = bucket.buffer()
    compressed = _staged(buffer.to(torch.bfloat16).div_(dist.get_world_size(group)), group_device(group))
    started = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(done: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(done.value()[0])
        return buffer

    return started.then(decompress)


class PendingExchange:
    """Point-to-point messages started by :func:`start_exchange`; :meth:`wait` completes them and
    fills the receive buffers."""

    def __init__(self, works: list[dist.Work], received: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self._works, self._received = works, received

    def wait(self) -> None:
        for work in self._works:
            work.wait()
        for staged, into in self._received:
            _copy_back(staged, into)
        self._works, self._received = [], []


def start_exchange(
    sends: Sequence[tuple[torch.Tensor, int]],
    recvs: Sequence[tuple[torch.Tensor, int]],
    group: dist.ProcessGroup | None = None,
) -> PendingExchange:
    """Start sending each ``(tensor, peer)`` of ``sends`` and receiving into each ``(buffer, peer)``
    of ``recvs`` (peers are global ranks), all at once."""
    device = group_device(group)
    ops, received = [], []
    for tensor, peer in sends:
        ops.append(dist.P2POp(dist.isend, _staged(tensor, device), peer, group))
    for buffer, peer in recvs:
        staged = _staged(buffer, device)
        ops.append(dist.P2POp(dist.irecv, staged, peer, group))
        received.append((staged, buffer))
    works = dist.batch_isend_irecv(ops) if ops else []
    return PendingExchange(works, received)


def exchange(
    sends: Sequence[tuple[torch.Tensor, int]],
    recvs: Sequence[tuple[torch.Tensor, int]],
    group: dist.ProcessGroup | None = None,
) -> None:
    """:func:`start_exchange`, then wait for it."""
    start_exchange(sends, recvs, group).wait()


def workers_backend(devices: Sequence[torch.device], requested: str | None) -> tuple[str, str | None]:
    """The backend for a process group whose ranks run on ``devices`` (one node's; every node is
    laid out alike), and why, when it is not the usual one for the devices.

    ``requested`` is the user's ``process_group_backend`` (``None``: choose). NCCL serves CUDA
    devices, one rank per GPU; when two ranks share a GPU the choice is gloo (NCCL refuses them).
    A request that cannot serve the devices raises a ValueError naming the setting to change.

    Example::

        >>> workers_backend([torch.device("cuda", 0)] * 2, None)[0]
        'gloo'
    """
    cuda = [d for d in devices if d.type == "cuda"]
    shared = len(set(cuda)) < len(cuda)
    if requested is not None:
        if "nccl" in requested and len(cuda) < len(devices):
            raise ValueError(
                f"process_group_backend={requested!r} serves CUDA devices only, but the processes run on "
                f"{sorted({str(d) for d in devices})}; set process_group_backend to 'gloo' or null"
            )
        if "nccl" in requested and shared:
            raise ValueError(
                f"process_group_backend={requested!r}: NCCL cannot serve two processes on one GPU "
                f"({[str(d) for d in devices]}); set process_group_backend=null (gloo is then chosen) or give each "
                "process a GPU of its own (trainer.devices no more than the GPUs)"
            )
        return requested, None
    if not cuda:
        return "gloo", None
    if shared:
        return "gloo", (
            f"{len(cuda)} processes share {len(set(cuda))} GPU(s) ({', '.join(str(d) for d in cuda)}); NCCL cannot serve "
            "two processes on one GPU, so their process group uses gloo (collectives go through host memory)"
        )
    return "nccl", None
