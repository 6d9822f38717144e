"""Delayed gradient averaging (DGA; Zhu, Lin, Lu, Lin and Han, NeurIPS 2021): each rank steps with its own
gradient at once, and corrects its state by the ranks' average ``delay`` steps later.

A delayed all-reduce that applies only the average, ``delay`` steps late (Pipe-SGD,
:class:`~lightning_hybrid.comm.delayed_allreduce.DelayedAllReduce` on its own), updates every rank with
gradients that are stale by ``delay`` steps: a stale gradient acts as momentum of its own, and at
momentum 0.9 it needed twice DDP's samples. Under DGA the newest gradient in a rank's state is always
its own, computed at its own weights; only what the other ranks contributed arrives late.

Exactly, for step ``t`` (counted from 0 over the fit) of rank ``r``, whose gradient ``g_t^r`` is computed
at its weights of that moment:

* **SGD** (``torch.optim.SGD``, with momentum, dampening, Nesterov, weight decay, maximize; the rule
  ``"replace"``): after step ``t`` the rank's weights *and momentum buffers* are exactly those of SGD
  fed the gradients ``avg_0, ..., avg_{t-D}, g_{t-D+1}^r, ..., g_t^r`` (``avg_s`` the ranks' mean of
  ``g_s``), each step at its own learning rate. So the ranks differ only by their last ``D`` local
  gradients, and every momentum buffer holds the average wherever it is known. It is done without
  replaying anything: SGD is linear in its gradients, so replacing ``g_s^r`` by ``avg_s`` moves the
  weights and the buffer by ``a * (avg_s - g_s^r)`` and ``b * (avg_s - g_s^r)``, where the scalars
  ``a, b`` (per parameter group) are SGD's response over steps ``s..t`` to a unit change of step
  ``s``'s gradient (:func:`sgd_response`: the learning rates each step used, the momentum, weight
  decay, dampening, and whether step ``s`` was the buffer's first).
* **Any other optimizer** (Adam, AdamW, ...; the rule ``"update"``): the exchanged value is the
  rank's *update* ``u_t^r = w_before - w_after`` of its own optimizer step, and when the average of
  step ``s`` arrives the weights move by ``u_s^r - avg_s(u)``: the weights are then ``w_0`` minus the
  ranks' mean updates up to ``t - D`` minus the rank's own last ``D``. The optimizer's state
  (Adam's moments and step count) stays local: its second moment is not linear in the gradient, so
  no correction of it to the average's exists without recomputing every step since ``s``. Each rank's
  moments are those of its own gradients (a noisier second moment than DDP's of the mean gradient,
  hence slightly shorter steps), as an inner optimizer of local SGD (DiLoCo's AdamW) keeps its own.

``delay=0`` (and each step :meth:`DelayedGradientAveraging.step` is told is ``synchronous``) is DDP
for every optimizer: the average is waited for and stepped with, nothing local. At a sync point
(:meth:`DelayedGradientAveraging.sync`) every pending average is applied; the ranks' weights are
then equal in exact arithmetic, and rank 0's weights and optimizer state are broadcast so that they
are equal to the bit (floating-point rounding of the corrections differs between ranks), and an
epoch-end checkpoint, written by rank 0, resumes every rank exactly.

Plain torch.distributed (gloo or NCCL), usable without Lightning::

    dga = DelayedGradientAveraging(optimizer, delay=2)
    for batch in batches:
        loss(batch).backward()
        dga.step()                  # in place of optimizer.step()
        optimizer.zero_grad()
    dga.sync()                      # at a sync point: every average applied, every rank the same
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from lightning_hybrid.comm.collectives import broadcast_
from lightning_hybrid.comm.delayed_allreduce import DelayedAllReduce, InFlight, learning_rates
from lightning_hybrid.comm.flat import copy_into, flatten, slices

RULES = ("replace", "update")


def sgd_response(lrs: Sequence[float], first: bool, momentum: float = 0.0, dampening: float = 0.0,
                 nesterov: bool = False, weight_decay: float = 0.0, maximize: bool = False) -> tuple[float, float]:
    """How a unit change of the gradient of the first of the steps ``lrs`` (their learning rates, in
    order) moves torch's SGD weights and momentum buffer by the end of the last: ``(a, b)``.
    ``first``: whether that step created the buffer (``buf = grad``, no dampening).

    Example::

        >>> sgd_response([0.1, 0.1], first=False, momentum=0.5)   # -0.1 * (1 + 0.5), 0.5
        (-0.15000000000000002, 0.5)
    """
    sign = -1.0 if maximize else 1.0
    d = sign  # the change of the step's gradient after weight decay (the weights have not moved yet)
    buf = (d if first else (1.0 - dampening) * d) if momentum else 0.0
    w = -lrs[0] * ((d + momentum * buf if nesterov else buf) if momentum else d)
    for lr in lrs[1:]:
        d = weight_decay * w
        if momentum:
            buf = momentum * buf + (1.0 - dampening) * d
            w -= lr * (d + momentum * buf if nesterov else buf)
        else:
            w -= lr * d
    return w, buf


@dataclass
class _Step:
    """What a correction needs to know of one optimizer step: each group's learning rate, and which
    parameters' momentum buffers it created."""

    lrs: list[float]
    first: list[bool] = field(default_factory=list)


class DelayedGradientAveraging:
    """Delayed gradient averaging over ``optimizer``'s parameters (see the module docstring).

    Args:
        optimizer: the torch optimizer (its parameters, in order, are the same on every rank).
        delay: ``D``, steps between a step and the correction by its average.
        bucket_size_mb: the exchange's buckets (one all-reduce each).
        group: the process group (a group of its own: its all-reduces run in the background).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, delay: int, bucket_size_mb: float = 25.0,
                 group: dist.ProcessGroup | None = None) -> None:
        self.optimizer = optimizer
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.rule = "replace" if isinstance(optimizer, torch.optim.SGD) else "update"
        self.exchange = DelayedAllReduce(self.params, delay, bucket_size_mb, group=group)
        self.delay, self.group = delay, group
        self._group_of = [i for i, g in enumerate(optimizer.param_groups) for _ in g["params"]]
        #: Optimizer steps taken so far (the index the next step gets).
        self.steps = 0
        self._history: dict[int, _Step] = {}
        #: Averages applied (as corrections, or stepped with when synchronous).
        self.applied = 0

    @property
    def stop(self) -> int:
        """The largest stop signal a completed exchange carried (0: none)."""
        return self.exchange.stop

    @property
    def pending(self) -> int:
        return self.exchange.pending

    # ------------------------------------------------------------------ the step
    def step(self, stop: int = 0, synchronous: bool = False) -> None:
        """In place of ``optimizer.step()``, after the backward pass: this rank's step, its exchange
        started (carrying ``stop``, this rank's stop request), and the correction by the average of
        ``delay`` steps ago once it is in (waited for if it is not). ``synchronous``: this step is
        DDP's (warm-up steps), as every step is at ``delay=0``."""
        for p in self.params:  # as DDP: a parameter without a gradient takes a zero one
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if synchronous or self.delay == 0:
            self._synchronous_step(stop)
        elif self.rule == "replace":
            self._history[self.steps] = _Step(learning_rates(self.optimizer), [self._creates_buffer(p) for p in self.params])
            self.exchange.push(stop=stop, keep_local=True, tag=self.steps)
            self.optimizer.step()
        else:
            self._history[self.steps] = _Step(learning_rates(self.optimizer))
            before = flatten(self.params).clone()
            self.optimizer.step()
            update = before - flatten(self.params)
            self.exchange.push(stop=stop, values=list(slices(update, self.params)), keep_local=True, tag=self.steps)
        self.steps += 1
        item = self.exchange.pop_ready()
        if item is not None:
            self._correct(item)

    def _synchronous_step(self, stop: int) -> None:
        self._drain()  # nothing is pending before a synchronous step but after a change of delay
        self.exchange.push(stop=stop, tag=self.steps)
        item = self.exchange.pop_oldest()
        assert item is not None
        for p, piece in zip(self.params, slices(item.average, self.params)):
            p.grad.copy_(piece)
        self.optimizer.step()
        self.applied += 1

    def _creates_buffer(self, p: torch.Tensor) -> bool:
        """Whether SGD's step creates ``p``'s momentum buffer (its first step)."""
        return self.optimizer.state.get(p, {}).get("momentum_buffer") is None

    def _correct(self, item: InFlight) -> None:
        """Apply the average of step ``item.tag`` to this rank's state, as the rule says."""
        s = int(item.tag)
        assert item.local is not None
        if self.rule == "update":
            delta = item.local - item.average
            with torch.no_grad():
                for p, piece in zip(self.params, slices(delta, self.params)):
                    p.add_(piece.to(p.dtype))
        else:
            delta = item.average - item.local
            steps = [self._history[k] for k in range(s, self.steps)]
            responses: dict[tuple[int, bool], tuple[float, float]] = {}
            with torch.no_grad():
                for i, (p, piece) in enumerate(zip(self.params, slices(delta, self.params))):
                    g = self._group_of[i]
                    first = steps[0].first[i]
                    if (g, first) not in responses:
                        group = self.optimizer.param_groups[g]
                        responses[(g, first)] = sgd_response(
                            [step.lrs[g] for step in steps], first, group.get("momentum", 0.0), group.get("dampening", 0.0),
                            group.get("nesterov", False), group.get("weight_decay", 0.0), group.get("maximize", False))
                    a, b = responses[(g, first)]
                    p.add_(piece.to(p.dtype), alpha=a)
                    buffer = self.optimizer.state.get(p, {}).get("momentum_buffer")
                    if buffer is not None and b:
                        buffer.add_(piece.to(buffer.dtype), alpha=b)
        self.applied += 1
        for k in [k for k in self._history if k <= s]:
            del self._history[k]

    def _drain(self) -> None:
        while (item := self.exchange.pop_oldest()) is not None:
            self._correct(item)

    # ------------------------------------------------------------------ sync points
    def sync(self) -> None:
        """At a sync point (every rank at once): apply every pending average, then take rank 0's
        weights and optimizer state to the bit (one broadcast of each)."""
        self._drain()
        self._history.clear()
        source = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        weights = flatten(self.params)
        broadcast_(weights, src=source, group=self.group)
        copy_into(weights, self.params)
        state = [t for p in self.params for _, t in sorted(self.optimizer.state.get(p, {}).items())
                 if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if state:
            flat = flatten(state, dtype=torch.float64)
            broadcast_(flat, src=source, group=self.group)
            copy_into(flat, state)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """This rank's pending exchanges (waited for: the averages and its own values) and the steps
        they need to be applied: with the rank's weights and optimizer state, what a checkpoint
        written between sync points must hold so that a resumed run corrects as this one would."""
        return {"steps": self.steps, "pending": self.exchange.pending_state(),
                "history": {k: (v.lrs, v.first) for k, v in self._history.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
        self.exchange.load_pending_state(state["pending"])
        self._history = {int(k): _Step(list(lrs), list(first)) for k, (lrs, first) in state["history"].items()}
