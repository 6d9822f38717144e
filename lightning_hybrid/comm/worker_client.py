"""The worker's end of the parameter-server protocol (see :mod:`lightning_hybrid.comm.parameter_server`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lightning_hybrid.comm import channel
from lightning_hybrid.comm.channel import HEADER_LEN, ChannelClosedError, Op


@dataclass
class DatasetShape:
    """What the server needs to deal an epoch: sizes, the shuffle seed, a cap on batches."""

    num_samples: int
    batch_size: int
    drop_last: bool = False
    max_chunks: int | None = None
    seed: int = 0

    def fields(self) -> list[int]:
        cap = -1 if self.max_chunks is None else self.max_chunks
        return [self.num_samples, self.batch_size, int(self.drop_last), cap, self.seed]


@dataclass
class PullInfo:
    """What came back with the parameters."""

    version: int  # updates the server has applied
    staleness: int  # updates applied between this worker's read and its just-applied gradient
    gap: int  # iterations this worker is ahead of the slowest active one, as it starts the next
    max_gap: int  # the largest gap recorded so far
    global_syncs: int  # delay-mode synchronizations (or BSP rounds) so far
    chunk: torch.Tensor | None = None  # the next batch's sample indices, when one was asked for and dealt
    epoch_over: bool = False  # asked for the next batch, but the epoch has none left


class ParameterServerClient:
    """Requests from worker ``worker`` (of the Lightning world) to the server over the side channel."""

    def __init__(self, pg, worker: int) -> None:
        self.pg = pg
        self.worker = worker
        self._header = torch.zeros(HEADER_LEN, dtype=torch.int64)

    def _request(self, op: Op, fields: Sequence[int] = (), payloads: Sequence[torch.Tensor] = ()) -> list[int]:
        try:
            channel.send(self.pg, channel.header(op, self.worker, *fields), 0, channel.TAG_REQUEST)
            for payload in payloads:
                channel.send(self.pg, payload, 0, channel.TAG_REQUEST_PAYLOAD)
            channel.recv(self.pg, self._header, 0, channel.TAG_REPLY)
        except RuntimeError as err:
            raise ChannelClosedError(
                f"worker {self.worker}: no answer from the parameter server to {op.name} ({err}). The server died, "
                "or a worker it waits for died or stalled past the timeout; see the other processes' errors."
            ) from err
        reply = self._header.tolist()
        if reply[0] == Op.ERROR:
            message = self._recv_payload(torch.empty(reply[1], dtype=torch.uint8))
            raise RuntimeError(f"parameter server refused {op.name} from worker {self.worker}: {bytes(message.tolist()).decode()}")
        return reply

    def _recv_payload(self, tensor: torch.Tensor) -> torch.Tensor:
        return channel.recv(self.pg, tensor, 0, channel.TAG_REPLY_PAYLOAD)

    def init(self, optimizer: torch.optim.Optimizer) -> int:
        """Send the optimizer with its parameters and state (worker 0 only); return the parameter count."""
        data = channel.to_bytes({"optimizer": optimizer})
        return self._request(Op.INIT, [data.numel()], [data])[1]

    def next_chunk(self, epoch: int, dataset: DatasetShape) -> torch.Tensor | None:
        """The next sample indices to train on this epoch, or None when the epoch is done."""
        count = self._request(Op.CHUNK, [epoch, *dataset.fields()])[1]
        return self._recv_payload(torch.empty(count, dtype=torch.int64)) if count else None

    def _receive_params(self, reply: list[int], out: torch.Tensor) -> PullInfo:
        self._recv_payload(out)
        info = PullInfo(*reply[1:6])
        if reply[6] > 0:
            info.chunk = self._recv_payload(torch.empty(reply[6], dtype=torch.int64))
        info.epoch_over = reply[6] < 0
        return info

    def push(
        self,
        flat_grad: torch.Tensor,
        lrs: Sequence[float],
        out: torch.Tensor,
        next_chunk_of_epoch: int | None = None,
        weight: int = 1,
    ) -> PullInfo:
        """Push a gradient; block until the server lets this worker go on; newest parameters into ``out``.

        With ``next_chunk_of_epoch``, the worker's next batch of that epoch comes back with the
        parameters (``PullInfo.chunk``, or ``PullInfo.epoch_over``), saving a CHUNK round trip.
        With staleness 0 the server divides the round's summed pushes by their summed ``weight``:
        push a mean gradient with weight 1, or a sum over ``n`` samples with weight ``n``.
        """
        lr_tensor = torch.tensor(list(lrs), dtype=torch.float64)
        want = -1 if next_chunk_of_epoch is None else next_chunk_of_epoch
        reply = self._request(Op.PUSH, [len(lrs), flat_grad.numel(), want, weight], [lr_tensor, flat_grad])
        return self._receive_params(reply, out)

    def finish(self, out: torch.Tensor) -> PullInfo:
        """Report the end of this worker's epoch; block until every worker has; parameters into ``out``."""
        return self._receive_params(self._request(Op.FINISH), out)

    def optimizer_state(self) -> dict[str, Any]:
        """The server's optimizer state dict."""
        count = self._request(Op.STATE)[1]
        return channel.from_bytes(self._recv_payload(torch.empty(count, dtype=torch.uint8)))

    def shutdown(self) -> None:
        self._request(Op.SHUTDOWN)
