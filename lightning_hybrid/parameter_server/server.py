"""The parameter server process: authoritative parameters, the optimizer, the data.

Started by global rank 0 of a parameter-server strategy (:func:`start_server`; its
:class:`~lightning_hybrid.parameter_server.protocol.ServerSettings` arrive as JSON on standard
input), it joins the side channel (:mod:`~lightning_hybrid.parameter_server.channel`) as rank 0
and serves the requests of :mod:`~lightning_hybrid.parameter_server.protocol` one at a time:

* ``Init`` (worker 0, once per fit): the user's optimizer, pickled with the parameters it holds.
  Those parameter tensors become the authoritative copy, laid out in one flat CPU buffer
  (gradients too), so a push is received straight into place.
* ``Attach`` (a worker on the server's host, once per fit): the shared-memory segment its
  gradients and parameters travel through from then on
  (:mod:`~lightning_hybrid.parameter_server.shared_memory`); the server maps it and removes its name.
* ``NextChunk``: the next batch of sample indices
  (:class:`~lightning_hybrid.parameter_server.dispenser.ChunkDispenser`); the first request
  describes the dataset (size, batch size, seed).
* ``Push``: a gradient, its worker's hyperparameters and clip (a step takes the newest push's:
  :mod:`~lightning_hybrid.parameter_server.step_settings`), and, optionally, a request for the
  worker's next batch, which then comes back with the parameters. With staleness
  > 0 the :class:`~lightning_hybrid.parameter_server.update_rule.UpdateRule` accumulates it and
  says when to step (by default every ``workers`` pushes, weighted by staleness, with the momentum
  corrected for it); with staleness 0 the round's gradients are averaged into one step, each weighted by the weight it comes with: 1 per mini-batch, or, in batch mode
  (cNeural, paper 002), the number of samples whose gradients a worker summed over its whole
  shard, so that the step takes the mean gradient over the whole training set. A step moves only the
  parameters that had a gradient in some push it averages (:mod:`~lightning_hybrid.parameter_server.gradient_mask`):
  the others' ``.grad`` is None while the optimizer steps (weight decay and momentum leave them alone), as
  under DDP; one with a gradient from some workers only gets the average, zeros from the others. Whether and when
  the worker gets the newest parameters back is the
  :class:`~lightning_hybrid.parameter_server.sync_controller.SyncController`'s decision.
* ``Finish``: the worker's data ran out; when every worker has finished, all receive the same
  parameters (the epoch's global synchronization) and the next epoch may begin.
* ``GetState``: the optimizer's state dict, for checkpoints.
* ``Shutdown``: exit, answering with what the server did and how busy it was
  (:class:`~lightning_hybrid.parameter_server.load.ServerLoad`).
* ``StopRun`` (a worker was asked to stop by a signal): from then on every request, and every one the
  server holds, is answered at once, saying so (``stop``), so that every worker stops at its next
  exchange with it, wherever it is (waiting for its peers included); nothing more is applied. Each
  worker then sends ``Leave`` (a worker whose connection breaks counts as gone), and the server
  exits once every worker has.

A failing request is answered with ``Refused`` (the error's text), then the server exits with the
error. It also exits when the process that started it dies.

A worker whose connection breaks (its process died) ends the server with an error, unless the
settings say ``on_worker_failure="continue"``: then the batches dealt to it and not yet pushed are
dealt again to the others, nobody waits for it any more (its round, its sync, its share of an
update), and every later reply tells the workers which of them are left (``Parameters.live``), so
that they can regroup at the epoch's synchronization. Worker 0 (the process that started the
server) cannot be lost: its death ends the run.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import torch

from lightning_hybrid.comm.flat import flatten_in_place
from lightning_hybrid.parameter_server import channel
from lightning_hybrid.parameter_server.adoption import adopter, shares_of
from lightning_hybrid.parameter_server.channel import Payload, WorkerLostError
from lightning_hybrid.parameter_server.dispenser import ChunkDispenser, OneDataset
from lightning_hybrid.parameter_server.gradient_mask import received_mask, stepping_only
from lightning_hybrid.parameter_server.load import LoadMeter
from lightning_hybrid.parameter_server.protocol import (
    ATTACH_FAILED, ATTACHED, NOT_ON_THIS_HOST, STOPPED_BY_SIGNAL, Attach, Attached, Bye, Chunk, Finish, GetState, Init, Initialized, Leave, Message, NextChunk, Parameters, Push, Refused, Shutdown, State, Stopping, StopRun,
)
from lightning_hybrid.parameter_server.shared_memory import SharedSegment
from lightning_hybrid.parameter_server.average_clip import ShardNorms
from lightning_hybrid.parameter_server.step_settings import StepSettings
from lightning_hybrid.parameter_server.sync_controller import Decision, SyncController
from lightning_hybrid.parameter_server.step_wait import StepWaits
from lightning_hybrid.parameter_server.update_rule import RoundSum, UpdateRule

log = logging.getLogger(__name__)


@dataclass
class Optimization:
    """The optimizer and the authoritative parameters, from worker 0's ``Init``."""

    optimizer: torch.optim.Optimizer
    params: list[torch.Tensor]  # in the optimizer's order, each ``.grad`` a view of ``flat_grads``
    flat_params: torch.Tensor
    flat_grads: torch.Tensor
    settings: StepSettings  # the newest push's hyperparameters and clip
    round: RoundSum | None = None  # staleness 0: the round's pushes


class ParameterServer:
    """Serves the requests of ``num_workers`` workers over the side channel ``pg`` (see the module doc).

    ``rule`` turns pushes into steps when staleness > 0 (with staleness 0 every round is one step);
    after ``max_steps`` steps (``-1``: no limit) no push is applied and every reply says stop."""

    def __init__(self, pg, num_workers: int, staleness: float, sync: str, rule: UpdateRule | None = None,
                 max_steps: int = -1, step_patience: float = 0.0, on_worker_failure: str = "stop",
                 pushes_follow_workers: bool = False, batch_mode: bool = False, num_params: int = 0,
                 bulk_dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 norms: ShardNorms | None = None) -> None:
        self.inbox = channel.Inbox(pg, num_workers, num_params, bulk_dtype)
        self.device = torch.device(device)
        self.num_workers = num_workers
        self.controller = SyncController(num_workers, staleness, sync)
        self.rule = rule or UpdateRule()
        self.max_steps = max_steps
        self._stop_code = 1
        self.waits = StepWaits(num_workers, step_patience)
        self.load = LoadMeter()
        self.norms = norms  # with several shards: the other shards' part of a clipped step's norm
        self.opt: Optimization | None = None
        self.dispenser: ChunkDispenser | None = None
        self._datasets = OneDataset()  # every worker's training data must be the same dataset
        self.version = 0  # optimizer steps taken
        self.read_version = [0] * num_workers  # the version each worker last received
        self.finished: set[int] = set()
        self._last_staleness = [0] * num_workers
        self._chunk_wanted: dict[int, int] = {}  # worker -> epoch of the batch to send with its next parameters
        self.on_worker_failure = on_worker_failure
        self.pushes_follow_workers = pushes_follow_workers
        self.lost: set[int] = set()
        self.segment = 0  # the segment of the epoch being trained (val_check_interval: a sync between segments)
        self._ahead: set[int] = set()  # workers dealt a batch of the next segment (no more until its sync)
        self._broken: dict[int, BaseException] = {}  # workers a reply could not reach
        # Batch mode (each push a sum over a worker's whole share, one per pass):
        self.batch_mode = batch_mode
        self._pass_live = set(range(num_workers))  # the live workers as this pass began (their shares)
        self._pushed_pass: set[int] = set()  # the workers whose pass sum arrived this pass
        self._owed: dict[int, int] = {}  # lost worker -> the shares (a bit each) its missing pass covered
        self._asked: dict[int, int] = {}  # lost worker -> the adopter asked for its owed shares
        self.signal = 0  # a worker stopped the run on this signal (StopRun)
        self.left: set[int] = set()  # the workers gone since (Leave, or a broken connection)

    # ---------------------------------------------------------------- replies
    def _reply(self, worker: int, message: Message, *payloads: torch.Tensor, bulk: torch.Tensor | None = None) -> None:
        if worker in self.lost or worker in self._broken:
            return
        try:
            self.inbox.send(message, worker, payloads, bulk)
        except Exception as err:  # noqa: BLE001 - gloo raises RuntimeError subclasses
            if self.on_worker_failure != "continue" or worker == 0:
                raise
            self._broken[worker] = err  # lost once the request being handled is done

    def _refuse(self, worker: int, text: str) -> None:
        data = channel.text_payload(text)
        self._reply(worker, Refused(data.numel()), data)

    def _send_params(self, worker: int, with_chunk: bool) -> None:
        """The newest parameters, and (a ``Push`` reply) the worker's next batch if it asked for one."""
        if worker in self.lost:
            return
        self.read_version[worker] = self.version
        c = self.controller
        gap = c.gap(worker) if worker in c.active else 0
        chunk, length = None, 0
        if with_chunk and worker in self._chunk_wanted:
            epoch = self._chunk_wanted.pop(worker)
            if worker not in self._ahead:  # one holding the next segment's batch asks again after the sync
                chunk = self._deal(worker, epoch)
                length = -1 if chunk is None else chunk.numel()
        segment = self.dispenser.last_segment if chunk is not None else 0
        reply = Parameters(self.version, self._last_staleness[worker], gap, c.max_gap, c.global_syncs, length,
                           self.stop_code, self._live_mask(), chunk_segment=segment)
        self._reply(worker, reply, *([chunk] if chunk is not None else []), bulk=self._optimization(worker).flat_params)
        self.waits.replied(worker, time.monotonic())  # its next cycle starts

    def _live_mask(self) -> int:
        return sum(1 << w for w in range(self.num_workers) if w not in self.lost)

    @property
    def stopped(self) -> bool:
        """Whether the server has taken its ``max_steps`` steps."""
        return 0 < self.max_steps <= self.version

    @property
    def stop_code(self) -> int:
        """The ``stop`` a reply carries: 0 (go on), 1 (``max_steps`` taken once the epoch's data was all
        dealt), 2 (taken inside the epoch: no validation at its end, as under DDP), ``STOPPED_BY_SIGNAL``
        + a signal (a worker stopped the run). The same in every reply after the last step or the stop."""
        if self.signal:
            return STOPPED_BY_SIGNAL + self.signal
        return self._stop_code if self.stopped else 0

    def _deal(self, worker: int, epoch: int) -> torch.Tensor | None:
        """The worker's next chunk of ``epoch``, or None when that epoch is over (or not the current
        one, or the run has taken its steps)."""
        if self.dispenser is None or epoch != self.dispenser.epoch or self.stopped:
            return None
        chunk = self.dispenser.next_chunk(worker)
        if chunk is not None and self.dispenser.last_segment > self.segment:
            self._ahead.add(worker)  # it syncs before training this one
        return chunk

    def _optimization(self, worker: int) -> Optimization:
        if self.opt is None:
            raise RuntimeError(f"worker {worker} needs the optimizer before worker 0 sent it (Init)")
        return self.opt

    # ---------------------------------------------------------------- handlers
    def handle_init(self, worker: int, request: Init, payload: Payload) -> None:
        config = channel.from_bytes(payload.take(torch.uint8, request.nbytes))
        optimizer: torch.optim.Optimizer = config["optimizer"]
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if self.device.type != "cpu":
            state = optimizer.state_dict()
            for p in params:
                p.data = p.data.to(self.device)
            optimizer.load_state_dict(state)  # the state moves to where the parameters are
        flat_params, flat_grads = flatten_in_place(params, self.device)
        self.inbox.grow(flat_params.numel())
        self.opt = Optimization(optimizer, params, flat_params, flat_grads, StepSettings(optimizer, params, self.rule, self.norms),
                                RoundSum(flat_grads) if self.controller.bsp else None)
        log.info(
            "%d parameters on %s, %d workers, staleness %s (%s)",
            flat_params.numel(), self.device, self.num_workers, self.controller.staleness, self.controller.mode,
        )
        self._reply(worker, Initialized(flat_params.numel()))

    def handle_attach(self, worker: int, request: Attach, payload: Payload) -> None:
        name = payload.text(request.name_len)
        try:
            segment = SharedSegment.attach(name, request.region_bytes)
        except FileNotFoundError:  # another host (or another /dev/shm): the channel carries its bulk
            self._reply(worker, Attached(NOT_ON_THIS_HOST))
            return
        except (OSError, ValueError) as err:
            text = channel.text_payload(f"{type(err).__name__}: {err}")
            self._reply(worker, Attached(ATTACH_FAILED, text.numel()), text)
            return
        self.inbox.attach(worker, segment)
        log.info("worker %d: gradients and parameters through shared memory (%s)", worker, name)
        self._reply(worker, Attached(ATTACHED))

    def handle_next_chunk(self, worker: int, request: NextChunk, payload: Payload) -> None:
        if mismatch := self._datasets.check(worker, request.dataset.num_samples):  # one dataset's indices for all
            return self._refuse(worker, mismatch)
        if self.dispenser is None:
            shape = request.dataset
            self.dispenser = ChunkDispenser(
                shape.num_samples, shape.batch_size, self.num_workers, seed=shape.seed, drop_last=shape.drop_last,
                dynamic=not self.controller.bsp, max_chunks=shape.max_chunks, shuffle=shape.shuffle,
                segment_chunks=shape.segment_chunks,
            )
        # Workers move to a new epoch together (after its global synchronization). A request for a
        # later epoch starts it; one for an earlier epoch comes from an iterator Lightning abandons
        # (it prefetches when restoring a finished epoch from a checkpoint) and gets "epoch over".
        if self.dispenser.epoch is None or request.epoch > self.dispenser.epoch:
            self.dispenser.start_epoch(request.epoch)
            self.segment = 0
        chunk = self._deal(worker, request.epoch)
        if chunk is None:
            self._reply(worker, Chunk(0))
        else:
            self._reply(worker, Chunk(chunk.numel(), self.dispenser.last_segment), chunk)

    def handle_push(self, worker: int, request: Push, payload: Payload) -> None:
        self.waits.pushed(worker, time.monotonic())
        self.load.pushed()
        opt = self._optimization(worker)
        opt.settings.received(worker, request, payload)  # first in the payload
        if request.numel != opt.flat_grads.numel():
            raise RuntimeError(
                f"worker {worker} pushed {request.numel} gradient values; the server holds {opt.flat_grads.numel()} parameters"
            )
        mask = received_mask(worker, request.tensors, len(opt.params), payload)
        grads = payload.bulk(request.numel)  # a view (mailbox or shared memory): used before this worker's reply
        if grads.device != self.device:
            grads = grads.to(self.device)
        if request.shares:  # a lost worker's shares of this pass, computed by its adopter
            self._receive_owed(worker, request, grads, mask)
            return
        read = request.read_version if request.read_version >= 0 else self.read_version[worker]
        staleness = self.version - read
        if self.stopped:
            pass  # the run has taken its steps: nothing more is applied
        elif self.controller.bsp:
            opt.round.add(grads, request.weight, mask)  # a batch-mode push is already a sum over `weight` samples
        elif self.rule.add(grads, staleness, request.weight, mask):
            self._step_rule_average()
            for w in self.waits.release_all():  # they waited for this step
                self._send_params(w, with_chunk=True)
        self._last_staleness[worker] = staleness  # reported back with the parameters
        if self.dispenser is not None:
            self.dispenser.trained(worker, request.batches)
        if request.chunk_epoch >= 0:  # the worker's next batch travels with its parameters: no extra round trip
            self._chunk_wanted[worker] = request.chunk_epoch
        self._pushed_pass.add(worker)
        self._apply(self.controller.push(worker), pusher=worker)
        self._ask_to_adopt(worker)

    # ---------------------------------------------------------------- batch mode: lost shares
    def _adopter(self, lost: int) -> int:
        return adopter(lost, set(range(self.num_workers)) - self.lost, self.num_workers)

    def _ask_to_adopt(self, worker: int) -> None:
        """If ``worker`` (waiting for its pass's round) adopts a lost worker's owed shares, ask it
        for their gradient sum, at the parameters it holds: the reply names them in ``adopt``."""
        if worker not in self.controller.held:
            return
        for lost, shares in self._owed.items():
            if lost not in self._asked and self._adopter(lost) == worker:
                self._asked[lost] = worker
                c = self.controller
                reply = Parameters(self.version, 0, 0, c.max_gap, c.global_syncs, stop=self.stop_code,
                                   live=self._live_mask(), adopt=shares)
                self._reply(worker, reply, bulk=self.opt.flat_params)
                return

    def _receive_owed(self, worker: int, request: Push, grads: torch.Tensor, mask: torch.Tensor | None) -> None:
        lost = next((w for w, asked in self._asked.items() if asked == worker and self._owed[w] == request.shares), None)
        if lost is None:
            raise RuntimeError(f"worker {worker} pushed the shares {request.shares:#x}, which nobody asked it for")
        del self._owed[lost], self._asked[lost]
        self.opt.round.add(grads, request.weight, mask)
        log.warning("worker %d computed the pass of lost worker %d (%d samples)", worker, lost, request.weight)
        self._apply(self.controller.remove(lost))  # its pass is in: the round no longer waits for it
        self._ask_to_adopt(worker)

    def handle_finish(self, worker: int, request: Finish, payload: Payload) -> None:
        self._optimization(worker)
        for w in self.waits.release_all():  # a worker that finished will not complete their step
            self._send_params(w, with_chunk=True)
        self.finished.add(worker)
        self._apply(self.controller.finish(worker))
        self._end_epoch_if_all_finished()

    def _end_epoch_if_all_finished(self) -> None:
        """The epoch's global synchronization, once every live worker has finished it."""
        if self.finished and self.controller.all_finished:
            for w in sorted(self.finished):
                self._last_staleness[w] = 0
                self._send_params(w, with_chunk=False)
            self.finished.clear()
            self.rule.synchronized()
            self.waits.synchronized()
            self.controller.new_epoch()
            if self._ahead:  # a segment's sync (not the epoch's end, nor the start of fitting)
                self.segment += 1
            self._ahead.clear()
            self._pass_live = set(self.controller.live)
            self._pushed_pass.clear()

    def lose(self, worker: int, error: BaseException) -> None:
        """``worker``'s connection broke: with ``on_worker_failure="continue"`` go on without it
        (see the module doc), else re-raise ``error``."""
        if self.signal:  # the run is stopping: a worker that stopped is gone, as asked
            self.left.add(worker)
            return
        if self.on_worker_failure != "continue" or worker == 0:
            raise error
        if worker in self.lost:
            return
        self.lost.add(worker)
        again = self.dispenser.lose(worker) if self.dispenser is not None else 0
        self._chunk_wanted.pop(worker, None)
        self._ahead.discard(worker)
        self.finished.discard(worker)
        self.waits.held.pop(worker, None)
        survivors = sorted(self.controller.live - {worker})
        log.warning(
            "worker %d is lost (its connection broke); %d batch(es) it held go to the others; continuing with workers %s",
            worker, again, ", ".join(map(str, survivors)),
        )
        log.debug("worker %d: %s", worker, error.__cause__ or error)
        if self.pushes_follow_workers and not self.controller.bsp:
            self.rule.pushes_per_update = max(1, len(survivors))
        for lost in [w for w, asked in self._asked.items() if asked == worker]:
            del self._asked[lost]  # it was computing them: its own adopter is asked instead
        if self.batch_mode and worker in self.controller.active and worker not in self._pushed_pass:
            # Its pass never arrived: the round waits for the shares it covered, from its adopter.
            self._owed[worker] = sum(1 << r for r in shares_of(worker, self._pass_live, self.num_workers))
        else:
            self._apply(self.controller.remove(worker))
        for w in sorted(self.controller.held):
            self._ask_to_adopt(w)
        if not self.controller.bsp and self.rule.pending and self.rule.pending >= self.rule.pushes_per_update:
            self._step_rule_average()  # the lost worker's share is no longer awaited
        for w in self.waits.release_all():  # they waited for a step the lost worker was to complete
            self._send_params(w, with_chunk=True)
        self._end_epoch_if_all_finished()

    def handle_stop_run(self, worker: int, request: StopRun, payload: Payload) -> None:
        if not self.signal:
            self.signal = request.signum
            if self.opt is not None:
                self.opt.settings.stop()  # a shard waiting for this one's part of a norm waits no more
            log.info("worker %d was asked to stop (signal %d): every worker stops at its next exchange", worker,
                     request.signum)
            held = set(self.controller.held) | set(self.waits.held) | self.finished
            self.controller.held.clear()
            self.waits.held.clear()
            self.finished.clear()
            for w in sorted(held - {worker}):  # they wait for peers that will not come
                self._send_params(w, with_chunk=False)
        self._reply(worker, Stopping(self.signal))

    def handle_leave(self, worker: int, request: Leave, payload: Payload) -> None:
        self.left.add(worker)
        self._reply(worker, Stopping(self.signal))

    def _answer_stopped(self, worker: int, request: Message, payload: Payload) -> None:
        """After a ``StopRun``: what any request gets at once."""
        if isinstance(request, NextChunk):
            self._reply(worker, Chunk(0, stop=self.stop_code))
        else:
            self._send_params(worker, with_chunk=False)

    @property
    def everyone_left(self) -> bool:
        return bool(self.signal) and self.left | self.lost >= set(range(self.num_workers))

    def handle_get_state(self, worker: int, request: GetState, payload: Payload) -> None:
        data = channel.to_bytes(self._optimization(worker).optimizer.state_dict())
        self._reply(worker, State(data.numel()), data)

    # ---------------------------------------------------------------- internals
    def _step_rule_average(self) -> None:
        """Staleness > 0: the step of the update rule's average of its pushes."""
        self.rule.take_average(out=self.opt.flat_grads)
        self._step(self.rule.stepped)

    def _step(self, stepped: torch.Tensor | None) -> None:
        """One optimizer step of the tensors ``stepped`` says had a gradient (None: all), as the newest push says."""
        self.opt.settings.before_step(stepped, self.version)
        with stepping_only(self.opt.params, stepped):
            self.opt.optimizer.step()
        self.version += 1
        self.load.stepped()
        if self.stopped:
            self._stop_code = 1 if self.dispenser is None or self.dispenser.exhausted() else 2

    def _apply(self, decision: Decision, pusher: int | None = None) -> None:
        opt = self.opt
        if decision.apply_round and opt.round.take_average(out=opt.flat_grads):
            self._step(opt.round.stepped)
        for w in decision.release:
            if w == pusher and self._wait_for_step(w):
                continue
            self._send_params(w, with_chunk=True)

    def _wait_for_step(self, worker: int) -> bool:
        """Hold ``worker``'s reply for the next step, when its peers are expected to complete it soon."""
        if self.controller.bsp or self.stopped or not self.rule.pending:
            return False
        c = self.controller
        peers = [w for w in c.active if w != worker and w not in c.held and w not in self.waits.held]
        needed = math.ceil(self.rule.pushes_per_update - self.rule.pending - 1e-9)
        deadline = self.waits.deadline(worker, needed, peers, time.monotonic())
        if deadline is None:
            return False
        self.waits.held[worker] = deadline
        return True

    def serve(self) -> None:
        """Answer requests until ``Shutdown``. A failing request is answered with ``Refused``, then re-raised."""
        handlers = {
            Init: self.handle_init, Attach: self.handle_attach, NextChunk: self.handle_next_chunk, Push: self.handle_push,
            Finish: self.handle_finish, GetState: self.handle_get_state, StopRun: self.handle_stop_run,
            Leave: self.handle_leave,
        }
        while not self.everyone_left:
            deadline = self.waits.next_deadline()
            try:
                received = self.inbox.next(None if deadline is None else max(0.0, deadline - time.monotonic()))
            except WorkerLostError as lost:
                received = None
                self.lose(lost.worker, lost)
            for w in self.waits.due(time.monotonic()):
                self._send_params(w, with_chunk=True)
            self._lose_unreachable()
            if received is None:
                continue
            worker, request, payload = received
            if isinstance(request, Shutdown):
                load = self.load.report()
                log.info("served %s", load.describe())
                self._reply(worker, Bye.of(load))
                return
            try:
                handler = handlers.get(type(request))
                if self.signal and isinstance(request, (Push, Finish, NextChunk)):
                    handler = self._answer_stopped
                if handler is None:
                    raise RuntimeError(f"{type(request).__name__} is not a request")
                with self.load.handling():
                    handler(worker, request, payload)
                self._lose_unreachable()
            except Exception as err:
                self._refuse(worker, f"{type(err).__name__}: {err}")
                raise

    def _lose_unreachable(self) -> None:
        while self._broken:
            worker, err = self._broken.popitem()
            self.lose(worker, WorkerLostError(worker, err))
