"""The parameter server process of SSPStrategy: authoritative parameters, the optimizer, the data.

Run as ``python -m lightning_hybrid.comm.parameter_server`` by the strategy (global rank 0 starts
it); it joins the side channel (:mod:`lightning_hybrid.comm.channel`) as rank 0 and serves
requests one at a time:

* ``INIT`` (worker 0, once per fit): the user's optimizer, pickled with the parameters it holds. Those parameter tensors become the authoritative copy, laid out in one
  flat CPU buffer (gradients too), so a push is received straight into place.
* ``CHUNK``: the next batch of sample indices (:class:`~lightning_hybrid.comm.chunks.ChunkDispenser`);
  the first request describes the dataset (size, batch size, seed).
* ``PUSH``: a gradient and the learning rates the worker's scheduler gives (and, optionally, a
  request for the worker's next batch, which then comes back with the parameters). With staleness > 0 it
  is applied at once by the optimizer; with staleness 0 the round's gradients are averaged into
  one step, each weighted by the weight it comes with: 1 per mini-batch, or, in batch mode
  (cNeural, paper 002), the number of samples whose gradients a worker summed over its whole
  shard, so that the step takes the mean gradient over the whole training set. Whether and when the worker gets the newest parameters back is the
  :class:`~lightning_hybrid.comm.sync_controller.SyncController`'s decision.
* ``FINISH``: the worker's data ran out; when every worker has finished, all receive the same
  parameters (the epoch's global synchronization) and the next epoch may begin.
* ``STATE``: the optimizer's state dict, for checkpoints.
* ``SHUTDOWN``: exit.

The server exits on its own when the process that started it dies.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass

import torch

from lightning_hybrid.comm import channel
from lightning_hybrid.comm.channel import HEADER_LEN, Op
from lightning_hybrid.comm.chunks import ChunkDispenser
from lightning_hybrid.comm.sync_controller import SYNC_MODES, SyncController

log = logging.getLogger(__name__)


@dataclass
class Optimization:
    """The optimizer and the authoritative parameters, from worker 0's INIT."""

    optimizer: torch.optim.Optimizer
    flat_params: torch.Tensor
    flat_grads: torch.Tensor
    round_sum: torch.Tensor | None = None  # staleness 0: the round's gradients, each times its weight
    round_weight: int = 0  # staleness 0: the weights summed (pushes, or samples in batch mode)


def flatten_in_place(params: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Move ``params`` into one flat float32 CPU buffer (their ``.data`` become views of it), and
    give each a ``.grad`` that is a view of a second flat buffer."""
    total = sum(p.numel() for p in params)
    flat_params = torch.empty(total, dtype=torch.float32)
    flat_grads = torch.zeros(total, dtype=torch.float32)
    offset = 0
    for p in params:
        n = p.numel()
        flat_params[offset : offset + n].copy_(p.detach().reshape(-1))
        p.data = flat_params[offset : offset + n].view_as(p)
        p.grad = flat_grads[offset : offset + n].view_as(p)
        offset += n
    return flat_params, flat_grads


class ParameterServer:
    """Serves the requests of ``num_workers`` workers over the side channel ``pg`` (see the module doc)."""

    def __init__(self, pg, num_workers: int, staleness: float, sync: str) -> None:
        self.pg = pg
        self.num_workers = num_workers
        self.controller = SyncController(num_workers, staleness, sync)
        self.opt: Optimization | None = None
        self.dispenser: ChunkDispenser | None = None
        self.version = 0  # updates applied
        self.read_version = [0] * num_workers  # the version each worker last received
        self.finished: set[int] = set()
        self._last_staleness = [0] * num_workers
        self._chunk_wanted: dict[int, int] = {}  # worker -> epoch of the batch to send with its next parameters
        self._header = torch.zeros(HEADER_LEN, dtype=torch.int64)

    # ---------------------------------------------------------------- replies
    def _reply(self, worker: int, fields: list[int], payload: torch.Tensor | None = None) -> None:
        channel.send(self.pg, channel.header(*fields), worker + 1, channel.TAG_REPLY)
        if payload is not None:
            channel.send(self.pg, payload, worker + 1, channel.TAG_REPLY_PAYLOAD)

    def _reply_error(self, worker: int, message: str) -> None:
        data = torch.frombuffer(bytearray(message.encode()), dtype=torch.uint8)
        self._reply(worker, [Op.ERROR, data.numel()], data)

    def _send_params(self, worker: int, op: Op) -> None:
        """The newest parameters, and with a PUSH reply the worker's next batch if it asked for one
        (header field 6: its length, -1 when the epoch is over, 0 when none was asked for)."""
        self.read_version[worker] = self.version
        c = self.controller
        gap = c.gap(worker) if worker in c.active else 0
        chunk, chunk_field = None, 0
        if op == Op.PUSH and worker in self._chunk_wanted:
            chunk = self._deal(worker, self._chunk_wanted.pop(worker))
            chunk_field = -1 if chunk is None else chunk.numel()
        fields = [op, self.version, self._last_staleness[worker], gap, c.max_gap, c.global_syncs, chunk_field]
        self._reply(worker, fields, self._optimization(worker).flat_params)
        if chunk is not None:
            channel.send(self.pg, chunk, worker + 1, channel.TAG_REPLY_PAYLOAD)

    def _deal(self, worker: int, epoch: int) -> torch.Tensor | None:
        """The worker's next chunk of ``epoch``, or None when that epoch is over (or not the current one)."""
        if self.dispenser is None or epoch != self.dispenser.epoch:
            return None
        return self.dispenser.next_chunk(worker)

    def _recv_payload(self, worker: int, tensor: torch.Tensor) -> torch.Tensor:
        return channel.recv(self.pg, tensor, worker + 1, channel.TAG_REQUEST_PAYLOAD)

    def _optimization(self, worker: int) -> Optimization:
        if self.opt is None:
            raise RuntimeError(f"worker {worker} needs the optimizer before worker 0 sent it (INIT)")
        return self.opt

    # ---------------------------------------------------------------- handlers
    def handle_init(self, worker: int, nbytes: int) -> None:
        config = channel.from_bytes(self._recv_payload(worker, torch.empty(nbytes, dtype=torch.uint8)))
        optimizer: torch.optim.Optimizer = config["optimizer"]
        params = [p for group in optimizer.param_groups for p in group["params"]]
        flat_params, flat_grads = flatten_in_place(params)
        round_sum = torch.zeros_like(flat_grads) if self.controller.bsp else None
        self.opt = Optimization(optimizer, flat_params, flat_grads, round_sum)
        log.info(
            "%d parameters, %d workers, staleness %s (%s)",
            flat_params.numel(), self.num_workers, self.controller.staleness, self.controller.mode,
        )
        self._reply(worker, [Op.INIT, flat_params.numel()])

    def handle_chunk(self, worker: int, epoch: int, num_samples: int, batch_size: int, drop_last: int, max_chunks: int, seed: int) -> None:
        if self.dispenser is None:
            self.dispenser = ChunkDispenser(
                num_samples, batch_size, self.num_workers, seed=seed, drop_last=bool(drop_last),
                dynamic=not self.controller.bsp, max_chunks=None if max_chunks < 0 else max_chunks,
            )
        # Workers move to a new epoch together (after its global synchronization). A request for a
        # later epoch starts it; one for an earlier epoch comes from an iterator Lightning abandons
        # (it prefetches when restoring a finished epoch from a checkpoint) and gets "epoch over".
        if self.dispenser.epoch is None or epoch > self.dispenser.epoch:
            self.dispenser.start_epoch(epoch)
        chunk = self._deal(worker, epoch)
        if chunk is None:
            self._reply(worker, [Op.CHUNK, 0])
        else:
            self._reply(worker, [Op.CHUNK, chunk.numel()], chunk)

    def handle_push(self, worker: int, num_groups: int, numel: int, chunk_epoch: int, weight: int = 1) -> None:
        # Receive the whole message first, so that a refusal never leaves the worker blocked in a send.
        lrs = self._recv_payload(worker, torch.empty(num_groups, dtype=torch.float64))
        opt = self.opt
        fits = opt is not None and numel == opt.flat_grads.numel()
        grads = self._recv_payload(worker, opt.flat_grads if fits and not self.controller.bsp else torch.empty(numel))
        opt = self._optimization(worker)
        if not fits:
            raise RuntimeError(f"worker {worker} pushed {numel} gradient values; the server holds {opt.flat_grads.numel()} parameters")
        for group, lr in zip(opt.optimizer.param_groups, lrs.tolist()):
            group["lr"] = lr
        staleness = 0
        if self.controller.bsp:
            opt.round_sum += grads  # a batch-mode push is already a sum over `weight` samples
            opt.round_weight += weight
        else:
            staleness = self.version - self.read_version[worker]
            self._step()
        self._last_staleness[worker] = staleness  # reported back with the parameters
        if chunk_epoch >= 0:  # the worker's next batch travels with its parameters: no extra round trip
            self._chunk_wanted[worker] = chunk_epoch
        self._apply(self.controller.push(worker))

    def handle_finish(self, worker: int) -> None:
        self._optimization(worker)
        self.finished.add(worker)
        self._apply(self.controller.finish(worker))
        if self.controller.all_finished:
            for w in sorted(self.finished):
                self._last_staleness[w] = 0
                self._send_params(w, Op.FINISH)
            self.finished.clear()
            self.controller.new_epoch()

    def handle_state(self, worker: int) -> None:
        data = channel.to_bytes(self._optimization(worker).optimizer.state_dict())
        self._reply(worker, [Op.STATE, data.numel()], data)

    # ---------------------------------------------------------------- internals
    def _step(self) -> None:
        self.opt.optimizer.step()
        self.version += 1

    def _apply(self, decision) -> None:
        opt = self.opt
        if decision.apply_round and opt.round_weight:
            opt.flat_grads.copy_(opt.round_sum).div_(opt.round_weight)
            self._step()
        if decision.apply_round:
            opt.round_sum.zero_()
            opt.round_weight = 0
        for w in decision.release:
            self._send_params(w, Op.PUSH)

    def serve(self) -> None:
        """Answer requests until SHUTDOWN. A failing request is answered with ERROR, then re-raised."""
        handlers = {
            Op.INIT: lambda w, h: self.handle_init(w, h[2]),
            Op.CHUNK: lambda w, h: self.handle_chunk(w, *h[2:8]),
            Op.PUSH: lambda w, h: self.handle_push(w, h[2], h[3], h[4], h[5]),
            Op.FINISH: lambda w, h: self.handle_finish(w),
            Op.STATE: lambda w, h: self.handle_state(w),
        }
        while True:
            source = channel.recv_any(self.pg, self._header, channel.TAG_REQUEST)
            worker = source - 1
            fields = self._header.tolist()
            op = Op(fields[0])
            if op == Op.SHUTDOWN:
                self._reply(worker, [Op.SHUTDOWN])
                return
            try:
                handlers[op](worker, fields)
            except Exception as err:
                self._reply_error(worker, f"{type(err).__name__}: {err}")
                raise


def _exit_when_orphaned(parent_pid: int, period: float = 1.0) -> None:
    def watch() -> None:
        while True:
            time.sleep(period)
            if os.getppid() != parent_pid:
                log.error("parameter server: the process that started it (pid %d) is gone; exiting", parent_pid)
                os._exit(3)

    threading.Thread(target=watch, daemon=True, name="ps-orphan-watch").start()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="lightning-hybrid parameter server (started by SSPStrategy)")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--staleness", type=float, required=True)
    parser.add_argument("--sync", choices=SYNC_MODES, required=True)
    parser.add_argument("--timeout", type=float, default=1800.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[parameter server] %(message)s", stream=sys.stderr)
    _exit_when_orphaned(os.getppid())
    torch.set_num_threads(1)
    pg = channel.open_channel(args.host, args.port, args.prefix, 0, args.workers + 1, args.timeout)
    ParameterServer(pg, args.workers, args.staleness, args.sync).serve()


if __name__ == "__main__":
    main()
