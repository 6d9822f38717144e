"""One stage's part of a pipeline schedule: its forwards and backwards, and the messages between stages.

:class:`StageExecutor` walks the action list :mod:`~lightning_hybrid.pipeline.schedules` gives
its stage. A forward on a stage after the first receives its input from the stage before (a small
header with the shape and dtype, then the tensor), runs the stage and, unless it is the last stage,
sends the output on; the last stage computes the micro-batch's loss instead. A backward receives
the gradient of the stage's output from the stage after (the last stage starts from its loss),
backpropagates through the stage and, unless it is the first stage, sends its input's gradient
back. Sends never block (they are waited for at the end of the step); receives do. Every message
goes through :mod:`lightning_hybrid.comm.collectives`, so a stage's tensors may live on a GPU
under NCCL or be staged through the CPU under gloo (several stages on one GPU).

Each executor keeps a :class:`StageProfile` of where its time went: computing (forwards and
backwards), waiting for a message from a neighbour (which includes the neighbour's own work: the
bubble shows here), and finishing its sends. The clocks are the host's: on a GPU, whose kernels run
asynchronously, compute launched but not finished shows up in the next wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields

import torch
import torch.distributed as dist
from torch import nn

from lightning_hybrid.comm.collectives import PendingExchange, exchange, start_exchange
from lightning_hybrid.pipeline.schedules import Action, Kind

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool]
_HEADER = 8  # dtype code, number of dimensions, up to six sizes


def _header(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dim() > _HEADER - 2:
        raise ValueError(f"a stage output of {tensor.dim()} dimensions; at most {_HEADER - 2} can travel")
    values = [_DTYPES.index(tensor.dtype), tensor.dim(), *tensor.shape]
    return torch.tensor(values + [0] * (_HEADER - len(values)), dtype=torch.int64)


@dataclass
class StageProfile:
    """Seconds a stage spent, since its last :meth:`reset`: computing its blocks (forwards and
    backwards), waiting for a neighbour's message (activations or gradients: the bubble and the
    transfer), finishing its own sends; and the training steps counted."""

    compute_s: float = 0.0
    wait_s: float = 0.0
    send_s: float = 0.0
    steps: int = 0

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, f.default)

    def as_dict(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in fields(self)}

    @contextmanager
    def timing(self, part: str) -> Iterator[None]:
        """Add the time spent inside the block to ``part`` (``"compute_s"``, ``"wait_s"``, ``"send_s"``)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, part, getattr(self, part) + time.perf_counter() - start)


def stage_time_metrics(per_rank: Sequence[dict[str, float] | None]) -> dict[str, float]:
    """Milliseconds a training step of each rank's stage spent computing, waiting and sending
    (``pipeline/rank<r>_compute_ms`` ...), from each rank's :meth:`StageProfile.as_dict` (None: a
    rank without a stage, or that took no step)."""
    metrics = {}
    for rank, times in enumerate(per_rank):
        if times and times["steps"]:
            for part in ("compute", "wait", "send"):
                metrics[f"pipeline/rank{rank}_{part}_ms"] = 1000 * times[f"{part}_s"] / times["steps"]
    return metrics


def describe_stage_times(per_rank: Sequence[dict[str, float] | None]) -> str:
    """``rank 0: compute 120, wait 31, send 2; rank 1: ...`` (ms a step), the ranks of :func:`stage_time_metrics`."""
    metrics = stage_time_metrics(per_rank)
    return "; ".join(
        f"rank {r}: " + ", ".join(f"{part} {metrics[f'pipeline/rank{r}_{part}_ms']:.0f}" for part in ("compute", "wait", "send"))
        for r, times in enumerate(per_rank) if times and times["steps"]
    )


class StageExecutor:
    """Runs stage ``stage`` of a pipeline whose stages are the global ranks ``stage_ranks``, in ``group``.

    Args:
        module: the stage's blocks (e.g. a :class:`~lightning_hybrid.pipeline.stage.StageModule`).
        stage: this stage's index.
        stage_ranks: the global rank running each stage, in stage order.
        group: the process group of the pipeline's ranks.
        device: where received tensors are put (the stage's parameters' device).
    """

    def __init__(self, module: nn.Module, stage: int, stage_ranks: Sequence[int], group: dist.ProcessGroup | None,
                 device: torch.device) -> None:
        if not 0 <= stage < len(stage_ranks):
            raise ValueError(f"stage {stage} of a pipeline of {len(stage_ranks)} stages")
        self.module, self.stage, self.stage_ranks = module, stage, list(stage_ranks)
        self.group, self.device = group, device
        self._pending: list[PendingExchange] = []
        self.profile = StageProfile()

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == len(self.stage_ranks) - 1

    # ---------------------------------------------------------------- messages
    def _send(self, tensor: torch.Tensor, stage: int, with_header: bool) -> None:
        tensor = tensor.detach().contiguous()
        sends = ([(_header(tensor), self.stage_ranks[stage])] if with_header else []) + [(tensor, self.stage_ranks[stage])]
        with self.profile.timing("send_s"):
            self._pending.append(start_exchange(sends, [], self.group))

    def _receive_activation(self) -> torch.Tensor:
        header = torch.empty(_HEADER, dtype=torch.int64)
        with self.profile.timing("wait_s"):
            exchange([], [(header, self.stage_ranks[self.stage - 1])], self.group)
            code, ndim, *sizes = header.tolist()
            tensor = torch.empty(sizes[:ndim], dtype=_DTYPES[code], device=self.device)
            exchange([], [(tensor, self.stage_ranks[self.stage - 1])], self.group)
        return tensor

    def _receive_gradient(self, like: torch.Tensor) -> torch.Tensor:
        grad = torch.empty_like(like)
        with self.profile.timing("wait_s"):
            exchange([], [(grad, self.stage_ranks[self.stage + 1])], self.group)
        return grad

    def _finish_sends(self) -> None:
        with self.profile.timing("send_s"):
            for pending in self._pending:
                pending.wait()
        self._pending.clear()

    # ---------------------------------------------------------------- steps
    def _forward(self, micro_inputs: Sequence[torch.Tensor] | None, i: int, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        x = micro_inputs[i] if self.first else self._receive_activation()
        if train and not self.first and x.is_floating_point():
            x.requires_grad_(True)
        with self.profile.timing("compute_s"):
            y = self.module(x)
        if not self.last:
            self._send(y, self.stage + 1, with_header=True)
        return x, y

    def train(
        self,
        actions: Sequence[Action],
        micro_inputs: Sequence[torch.Tensor] | None,
        micro_targets: Sequence[torch.Tensor] | None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        loss_scale: float,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Run a training step's actions. The last stage returns each micro-batch's loss (as
        ``loss_fn`` gives it) and output; the gradient of ``loss_scale`` times each loss is
        accumulated into the stage's parameters. Other stages return two empty lists."""
        losses, outputs = [], []
        saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        try:
            for action in actions:
                i = action.micro_batch
                if action.kind == Kind.FORWARD:
                    x, y = self._forward(micro_inputs, i, train=True)
                    if self.last:
                        with self.profile.timing("compute_s"):
                            loss = loss_fn(y, micro_targets[i])
                        losses.append(loss.detach())
                        outputs.append(y.detach())
                        y = loss * loss_scale
                    saved[i] = (x, y)
                    continue
                x, y = saved.pop(i)
                grad = None if self.last else self._receive_gradient(y)
                if y.requires_grad:  # not a stage of frozen blocks fed by the data (nothing before it to train)
                    with self.profile.timing("compute_s"):
                        torch.autograd.backward(y, grad)
                if not self.first:
                    self._send(x.grad if x.grad is not None else torch.zeros_like(x), self.stage - 1, with_header=False)
        finally:
            self._finish_sends()
        self.profile.steps += 1
        return losses, outputs

    @torch.no_grad()
    def forward(self, actions: Sequence[Action], micro_inputs: Sequence[torch.Tensor] | None) -> list[torch.Tensor]:
        """Run forward-only actions; the last stage returns each micro-batch's output."""
        outputs = []
        training_profile, self.profile = self.profile, StageProfile()  # the profile is training's
        try:
            for action in actions:
                if action.kind != Kind.FORWARD:
                    raise ValueError(f"{action} in a forward-only schedule")
                _, y = self._forward(micro_inputs, action.micro_batch, train=False)
                if self.last:
                    outputs.append(y)
        finally:
            self._finish_sends()
            self.profile = training_profile
        return outputs
