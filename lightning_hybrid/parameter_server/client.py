"""The worker's end of the parameter-server protocol (see :mod:`~lightning_hybrid.parameter_server.server`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lightning_hybrid.comm.stall_watch import excused_wait
from lightning_hybrid.parameter_server import channel
from lightning_hybrid.parameter_server.channel import ChannelClosedError
from lightning_hybrid.comm.clipping import Clip
from lightning_hybrid.parameter_server.average_clip import clip_numbers
from lightning_hybrid.parameter_server.hyperparameters import LEARNING_RATES, GroupValues
from lightning_hybrid.parameter_server.load import ServerLoad
from lightning_hybrid.parameter_server.protocol import (
    ATTACHED, NOT_ON_THIS_HOST, STOPPED_BY_SIGNAL, Attach, Attached, Bye, Chunk, DatasetShape, Finish, GetState, Init,
    Initialized, Leave, Message, NextChunk, Parameters, Push, Refused, Shutdown, State, Stopping, StopRun,
)
from lightning_hybrid.parameter_server.shared_memory import SHM_DIR, SharedSegment

log = logging.getLogger(__name__)

__all__ = ["ChannelClosedError", "DatasetShape", "ParameterServerClient", "PullInfo", "RunStopped"]


class RunStopped(Exception):
    """The server says a worker stopped the run on signal ``signum`` (see :meth:`ParameterServerClient.stop_run`)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"a worker stopped the run (signal {signum})")
        self.signum = signum


def _raise_run_stopped(signum: int) -> None:
    raise RunStopped(signum)


@dataclass
class PullInfo:
    """What came back with the parameters (see :class:`~lightning_hybrid.parameter_server.protocol.Parameters`)."""

    version: int
    staleness: int
    gap: int
    max_gap: int
    global_syncs: int
    chunk: torch.Tensor | None = None  # the next batch's sample indices, when one was asked for and dealt
    chunk_segment: int = 0  # the epoch's segment that batch belongs to
    epoch_over: bool = False  # asked for the next batch, but the epoch has none left
    stop: bool = False  # the server has taken its max_steps steps
    stopped_inside_epoch: bool = False  # ... before the epoch's data was all dealt
    live: int = 0  # the workers the server has not lost, a bit each (worker w: 1 << w)
    adopt: int = 0  # batch mode: push the sum over these lost workers' shares (a bit each) before going on


class ParameterServerClient:
    """Requests from worker ``worker`` (of the Lightning world) to the server over the side channel;
    gradients and parameters travel in ``bulk_dtype`` (the server's ``wire_dtype``)."""

    def __init__(self, pg, worker: int, bulk_dtype: torch.dtype = torch.float32, server_name: str = "parameter server") -> None:
        self.mailbox = channel.Mailbox(pg, bulk_dtype=bulk_dtype)
        self.worker = worker
        self.server_name = server_name  # in errors: "parameter server", or "parameter server shard 1"
        self._payload: channel.Payload | None = None  # the last reply's
        #: Called with the signal when a reply says a worker stopped the run; it must not return
        #: (default: raise :class:`RunStopped`; a strategy raises what its trainer stops on).
        self.on_run_stopped: Callable[[int], None] = _raise_run_stopped

    def _request(self, request: Message, expected: type[Message], payloads: Sequence[torch.Tensor] = (),
                 bulk: channel.Bulk | None = None) -> Any:
        self._send(request, payloads, bulk)
        return self._answer(request, expected)

    def _lost(self, request: Message, err: BaseException) -> ChannelClosedError:
        return ChannelClosedError(
            f"worker {self.worker}: no answer from the {self.server_name} to {type(request).__name__} ({err}). The "
            "server died, or a worker it waits for died or stalled past the timeout; see the other processes' errors."
        )

    def _send(self, request: Message, payloads: Sequence[torch.Tensor] = (), bulk: channel.Bulk | None = None) -> None:
        try:
            self.mailbox.send(request, 0, payloads, bulk=bulk)
        except RuntimeError as err:
            raise self._lost(request, err) from err

    def _answer(self, request: Message, expected: type[Message]) -> Any:
        """The reply to ``request`` (sent), checked to be an ``expected``."""
        try:
            with excused_wait():  # the server answers when the peers have pushed, or fails by itself
                reply, self._payload = self.mailbox.receive(0, reply=True)
        except RuntimeError as err:
            raise self._lost(request, err) from err
        if isinstance(reply, Refused):
            text = self._payload.text(reply.nbytes)
            raise RuntimeError(f"{self.server_name} refused {type(request).__name__.upper()} from worker {self.worker}: {text}")
        if getattr(reply, "stop", 0) >= STOPPED_BY_SIGNAL:
            self.on_run_stopped(reply.stop - STOPPED_BY_SIGNAL)
        if not isinstance(reply, expected):
            raise RuntimeError(f"the {self.server_name} answered {type(request).__name__} with {type(reply).__name__}")
        return reply

    def _take(self, dtype: torch.dtype, count: int) -> torch.Tensor:
        """The next tensor of the last reply's payload (a view: copy what you keep)."""
        return self._payload.take(dtype, count)

    def init(self, optimizer: torch.optim.Optimizer) -> int:
        """Send the optimizer with its parameters and state (worker 0 only); return the parameter count."""
        data = channel.to_bytes({"optimizer": optimizer})
        return self._request(Init(data.numel()), Initialized, [data]).num_params

    def attach_shared_memory(self, num_params: int, directory=SHM_DIR) -> str:
        """Move this worker's gradients and parameters to a shared-memory segment with the server, if
        it runs on this host: ``"shared_memory"``, or ``"channel"`` when it does not (another host), or
        when no segment of the size needed can be made here (one warning naming that size)."""
        region_bytes = num_params * torch.empty((), dtype=self.mailbox.bulk_dtype).element_size()
        try:
            segment = SharedSegment.create(region_bytes, directory)
        except OSError as err:
            needed = SharedSegment.nbytes(region_bytes)
            log.warning(
                "worker %d: no shared-memory segment of %d bytes (%.0f MiB) in %s (%s): gradients and parameters go "
                "through the side channel instead, slower for large models. To use shared memory, give %s that much "
                "per worker on this host (Docker: --shm-size).",
                self.worker, needed, needed / 2**20, directory, err, directory,
            )
            return "channel"
        try:
            name = channel.text_payload(segment.name)
            reply = self._request(Attach(region_bytes, name.numel()), Attached, [name])
        finally:
            segment.unlink()  # mapped by both sides now, or by none: the name is no longer needed
        if reply.status == ATTACHED:
            self.mailbox.segment = segment
            return "shared_memory"
        if reply.status != NOT_ON_THIS_HOST:
            text = self._payload.text(reply.nbytes)
            log.warning("worker %d: the parameter server could not map shared memory (%s): using the side channel",
                        self.worker, text)
        return "channel"

    def next_chunk(self, epoch: int, dataset: DatasetShape) -> tuple[torch.Tensor, int] | None:
        """The next sample indices to train on this epoch and the epoch's segment they belong to,
        or None when the epoch is done."""
        reply = self._request(NextChunk.of(epoch, dataset), Chunk)
        return (self._take(torch.int64, reply.length).clone(), reply.segment) if reply.length else None

    def _receive_params(self, reply: Parameters, out: torch.Tensor) -> PullInfo:
        info = PullInfo(reply.version, reply.staleness, reply.gap, reply.max_gap, reply.global_syncs, stop=bool(reply.stop),
                        stopped_inside_epoch=reply.stop == 2,
                        live=reply.live, adopt=reply.adopt)
        if reply.chunk > 0:
            info.chunk = self._take(torch.int64, reply.chunk).clone()
            info.chunk_segment = reply.chunk_segment
        info.epoch_over = reply.chunk < 0
        channel.spill(self._payload.bulk(channel.bulk_numel(out)), out)  # the bulk comes last
        return info

    def push(
        self,
        flat_grad: channel.Bulk,
        hyperparameters: Sequence[float] | GroupValues,
        out: channel.Bulk,
        next_chunk_of_epoch: int | None = None,
        weight: int = 1,
        read_version: int | None = None,
        batches: int = 1,
        shares: int = 0,
        has_gradient: torch.Tensor | None = None,
        clip: Clip | None = None,
    ) -> PullInfo:
        """Push a gradient; block until the server lets this worker go on; newest parameters into ``out``.

        ``flat_grad`` and ``out`` are flat vectors, or the model's tensors in order (read and written
        in place: no flat copy of the model on this side). ``hyperparameters``: what the server's step
        uses, every number of the worker's param groups
        (:meth:`~lightning_hybrid.parameter_server.hyperparameters.GroupLayout.group_values`), or each
        group's learning rate (a sequence, one per group: the server keeps its other values). ``clip``:
        how Lightning clipped this step's gradient (recorded, not applied on the worker): the server clips
        the average it steps with (:mod:`~lightning_hybrid.parameter_server.average_clip`).

        With ``next_chunk_of_epoch``, the worker's next batch of that epoch comes back with the
        parameters (``PullInfo.chunk``, or ``PullInfo.epoch_over``), saving a round trip.
        With staleness 0 the server divides the round's summed pushes by their summed ``weight``:
        push a mean gradient with weight 1, or a sum over ``n`` samples with weight ``n``.
        ``read_version``: the server step of the parameters the gradient was computed at (default:
        the last parameters this worker received). ``batches``: the dealt batches the gradient was
        computed on (the server deals them again if this worker is lost before pushing). ``shares``:
        batch mode, the lost workers' shares (a bit each) the sum covers, when the server asked for
        them (``PullInfo.adopt``). ``has_gradient``: one bool per parameter tensor, whether it had a
        gradient (:func:`~lightning_hybrid.parameter_server.gradient_mask.has_gradient`; the server steps
        only those); None: every tensor had one.
        """
        return self.pulled(self.send_push(flat_grad, hyperparameters, out, next_chunk_of_epoch, weight, read_version,
                                          batches, shares, has_gradient, clip), out)

    def send_push(self, flat_grad: channel.Bulk, hyperparameters: Sequence[float] | GroupValues, out: channel.Bulk,
                  next_chunk_of_epoch: int | None = None, weight: int = 1, read_version: int | None = None,
                  batches: int = 1, shares: int = 0, has_gradient: torch.Tensor | None = None,
                  clip: Clip | None = None) -> Push:
        """The first half of :meth:`push`: send it, without waiting for the reply (:meth:`pulled`)."""
        self.mailbox.grow(channel.bulk_numel(out))
        if isinstance(hyperparameters, GroupValues):
            values, layout = hyperparameters.values.to(torch.float64), hyperparameters.layout
        else:
            values, layout = torch.tensor(list(hyperparameters), dtype=torch.float64), LEARNING_RATES
        payloads = [values if clip is None else torch.cat([values, clip_numbers(clip)])]
        if has_gradient is not None and not bool(has_gradient.all()):  # a mask only when some tensor had none
            payloads.append(has_gradient.to(torch.uint8))
        want = -1 if next_chunk_of_epoch is None else next_chunk_of_epoch
        read = -1 if read_version is None else read_version
        tensors = payloads[1].numel() if len(payloads) > 1 else 0
        request = Push(values.numel(), channel.bulk_numel(flat_grad), want, weight, read, batches, shares, tensors, layout,
                       int(clip is not None))
        self._send(request, payloads, bulk=flat_grad)
        return request

    def pulled(self, request: Push | Finish, out: channel.Bulk) -> PullInfo:
        """The second half of :meth:`push` or :meth:`finish`: wait for the reply to ``request``, the
        parameters into ``out``."""
        return self._receive_params(self._answer(request, Parameters), out)

    def finish(self, out: torch.Tensor) -> PullInfo:
        """Report the end of this worker's epoch; block until every worker has; parameters into ``out``."""
        return self.pulled(self.send_finish(out), out)

    def send_finish(self, out: torch.Tensor) -> Finish:
        """The first half of :meth:`finish` (see :meth:`pulled`)."""
        self.mailbox.grow(out.numel())
        self._send(Finish())
        return Finish()

    def optimizer_state(self) -> dict[str, Any]:
        """The server's optimizer state dict."""
        reply = self._request(GetState(), State)
        return channel.from_bytes(self._take(torch.uint8, reply.nbytes))

    def shutdown(self) -> ServerLoad:
        """End the server; what it did over the fit and how busy it was."""
        return self._request(Shutdown(), Bye).load

    def stop_run(self, signum: int) -> None:
        """This worker was asked to stop: every worker's next exchange with the server says so (each
        then calls :attr:`on_run_stopped`), the ones waiting for their peers' included."""
        self._request(StopRun(signum), Stopping)

    def leave(self) -> None:
        """This worker stopped and leaves (the server exits once every worker has)."""
        self._request(Leave(), Stopping)


def load_server_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load the server's optimizer state (momentum, moments: :meth:`ParameterServerClient.optimizer_state`)
    into the worker's ``optimizer``, keeping its own hyperparameters (the schedulers run on the workers; the
    server applies the hyperparameters each push brings)."""
    for local, remote in zip(optimizer.param_groups, state["param_groups"]):
        remote.update({key: value for key, value in local.items() if key != "params"})
    optimizer.load_state_dict(state)
