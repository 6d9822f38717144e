"""Local SGD with an outer optimizer (DiLoCo), its averaging overlapped with the next rounds and streamed.

Every rank takes its own optimizer's steps (the *inner* optimizer, the user's) on its own data and
exchanges nothing for ``sync_every`` (H) steps; then the ranks average how far each moved (the
*pseudo-gradient*) and an *outer* optimizer moves the shared weights by that average (Douillard et al.
2023, DiLoCo: H in the hundreds, Nesterov momentum outside, 500x less communication than DDP). Its
averaging may run in the background, applied ``delay`` rounds later, while the next rounds compute
(as :class:`~lightning_hybrid.comm.delayed_allreduce.DelayedAllReduce` does with gradients), and the
model may be cut into ``fragments`` synchronised in turn (Streaming DiLoCo, arXiv 2501.18512), in bf16
on the wire.

Exactly, for each fragment ``f`` of ``F`` (the parameters cut into ``F`` consecutive groups of about
equal bytes): the fragment's global weights ``theta_f`` are the same on every rank and have an outer
optimizer of their own. Counting the inner steps since the last sync point from 1, fragment ``f``'s
rounds end after the steps ``t`` with ``(t + f * H / F) % H == 0`` (``F`` divides ``H``; with one fragment
after every ``H`` steps). A round of ``f`` starts with the rank's weights of ``f`` equal to ``theta_f`` and
ends with

1. ``delta = theta_f - w_f`` (this rank's pseudo-gradient over the round), averaged over the ranks
   (an all-reduce started now, in ``wire_dtype``);
2. if at least ``delay`` rounds of ``f`` have ended before this one, the outer optimizer's step on
   ``theta_f`` with the average of the round ``delay`` rounds back as its gradient (``delay=0``: this
   round's, waited for);
3. ``w_f = theta_f``: the next round starts from the global weights (this round's own progress comes
   back through its average).

The inner optimizer keeps its state across rounds. At a sync point (:meth:`LocalSGD.sync`: before
validation, at an epoch's end) every fragment ends its round early if it took steps, every pending
average is applied in order, the weights become ``theta`` on every rank, and the steps count from 0
again. With ``H = 1``, plain averaging (``outer="average"``: an outer SGD of rate 1 without momentum)
and a linear inner optimizer (SGD, with momentum or not) this is the delayed all-reduce of ``delay``
steps, and with ``delay = 0`` it is DDP (tests/comm/test_local_sgd.py checks both, and every setting
against a one-process reference of the same rules).

Plain torch.distributed: usable without Lightning::

    local = LocalSGD(model.parameters(), sync_every=32)   # delay=0: each round's average applied at once
    for batch in batches:
        loss(batch).backward(); inner.step(); inner.zero_grad()
        local.after_inner_step()
    local.sync()
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from lightning_hybrid.comm.collectives import Pending, start_all_reduce
from lightning_hybrid.comm.flat import copy_into, flatten
from lightning_hybrid.comm.stop_signal import WIDTH, decode, encode

OUTER_OPTIMIZERS = ("nesterov", "average")
WIRE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def validate(sync_every: int, delay: int, outer: str, outer_lr: float, outer_momentum: float, fragments: int,
             wire_dtype: str) -> None:
    """Raise a ValueError that says what is wrong with these settings."""
    for name, value, least in (("sync_every", sync_every, 1), ("delay", delay, 0), ("fragments", fragments, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    if sync_every % fragments:
        raise ValueError(f"fragments={fragments} must divide sync_every={sync_every}: fragment f syncs every "
                         f"sync_every steps, sync_every / fragments steps after fragment f - 1")
    if outer not in OUTER_OPTIMIZERS:
        raise ValueError(f"outer_optimizer must be one of {OUTER_OPTIMIZERS}, got {outer!r}")
    if not outer_lr > 0 or not 0 <= outer_momentum < 1:
        raise ValueError(f"outer_lr must be positive and outer_momentum in [0, 1), got {outer_lr} and {outer_momentum}")
    if wire_dtype not in WIRE_DTYPES:
        raise ValueError(f"wire_dtype must be one of {sorted(WIRE_DTYPES)}, got {wire_dtype!r}")


def cut_fragments(params: Sequence[torch.Tensor], fragments: int) -> list[list[int]]:
    """Parameter indices in ``fragments`` consecutive groups of about equal bytes (none empty): group
    ``f`` ends at the first parameter where the bytes so far reach ``(f + 1) / fragments`` of the total."""
    if fragments > len(params):
        raise ValueError(f"fragments={fragments} but the model has {len(params)} parameter tensors; use at most that many")
    cumulative = list(itertools.accumulate(p.numel() * p.element_size() for p in params))
    bounds = [0]
    for f in range(1, fragments):
        target = cumulative[-1] * f / fragments
        end = next(i + 1 for i, c in enumerate(cumulative) if c >= target)
        bounds.append(min(max(end, bounds[-1] + 1), len(params) - (fragments - f)))
    bounds.append(len(params))
    return [list(range(a, b)) for a, b in zip(bounds, bounds[1:])]


@dataclass
class _Fragment:
    """One fragment's global weights, outer optimizer, rounds ended, and averages in flight."""

    indices: list[int]
    theta: torch.Tensor  # global weights, flat, float32 (a leaf the outer optimizer steps)
    outer: torch.optim.Optimizer
    offset: int  # its rounds end after the steps t with (t + offset) % H == 0
    rounds: int = 0  # rounds ended since the fit began
    pending: deque = field(default_factory=deque)  # (Pending | averaged tensor), oldest first


class LocalSGD:
    """Local SGD with an outer optimizer over ``params`` (see the module docstring).

    Args:
        params: the model's parameters, in the same order on every rank.
        sync_every: ``H``, inner steps per round.
        delay: rounds between ending a round and applying its average (0: at once).
        outer: ``"average"`` (plain averaging) or ``"nesterov"`` (SGD with Nesterov momentum, DiLoCo's).
        outer_lr, outer_momentum: the Nesterov outer optimizer's rate and momentum (DiLoCo: 0.7, 0.9).
        fragments: ``F``, parts of the model synchronised in turn.
        wire_dtype: ``"fp32"`` or ``"bf16"``: the pseudo-gradients' dtype in the all-reduce.
        group: the process group (a group of its own: the averages run in the background).
        while_waiting: called about every second while this rank waits for an average (gloo; it may raise,
            to end a wait for ranks that will not come: :func:`~lightning_hybrid.comm.collectives.wait_in_pieces`).
    """

    def __init__(self, params: Sequence[torch.Tensor], sync_every: int, delay: int = 0, outer: str = "average",
                 outer_lr: float = 0.7, outer_momentum: float = 0.9, fragments: int = 1, wire_dtype: str = "fp32",
                 group: dist.ProcessGroup | None = None, while_waiting: Callable[[], None] | None = None) -> None:
        validate(sync_every, delay, outer, outer_lr, outer_momentum, fragments, wire_dtype)
        self.while_waiting = while_waiting
        self.params = list(params)
        self.sync_every, self.delay, self.group = sync_every, delay, group
        self.outer_name, self.outer_lr, self.outer_momentum = outer, outer_lr, outer_momentum
        self.wire = WIRE_DTYPES[wire_dtype]
        self.world_size = dist.get_world_size(group)
        self.fragments = [
            self._fragment(indices, offset=f * sync_every // fragments)
            for f, indices in enumerate(cut_fragments(self.params, fragments))
        ]
        self.steps = 0  # inner steps since the last sync point
        #: Seconds blocked waiting for averages (the communication the rounds did not hide).
        self.wait_s = 0.0
        #: Bytes of pseudo-gradients (and their stop flags) this rank handed to all-reduces, over the fit.
        self.bytes_sent = 0
        #: The largest stop signal an applied average carried (0: none asked for).
        self.stop = 0

    def _fragment(self, indices: list[int], offset: int) -> _Fragment:
        theta = flatten([self.params[i] for i in indices], dtype=torch.float32).clone().requires_grad_(False)
        if self.outer_name == "nesterov":
            outer = torch.optim.SGD([theta], lr=self.outer_lr, momentum=self.outer_momentum, nesterov=True)
        else:
            outer = torch.optim.SGD([theta], lr=1.0)
        return _Fragment(indices, theta, outer, offset)

    def _weights(self, fragment: _Fragment) -> list[torch.Tensor]:
        return [self.params[i] for i in fragment.indices]

    # ------------------------------------------------------------------ rounds
    def after_inner_step(self, stop: int = 0) -> None:
        """Call after each inner optimizer step: ends the rounds due now, each carrying ``stop`` (this
        rank's stop request, a signal number; 0: none) to every rank (:attr:`stop`)."""
        self.steps += 1
        for fragment in self.fragments:
            if (self.steps + fragment.offset) % self.sync_every == 0:
                self._end_round(fragment, keep=self.delay, stop=stop)

    def _end_round(self, fragment: _Fragment, keep: int, stop: int = 0) -> None:
        """Start averaging this round's pseudo-gradient (this rank's stop request appended); apply
        averages until ``keep`` are in flight."""
        delta = fragment.theta - flatten(self._weights(fragment), dtype=torch.float32)
        wire = torch.cat([delta.to(self.wire), encode(stop, self.wire)])
        self.bytes_sent += wire.numel() * wire.element_size()
        fragment.pending.append(start_all_reduce(wire, group=self.group))
        fragment.rounds += 1
        while len(fragment.pending) > keep:
            self._apply(fragment, fragment.pending.popleft())
        copy_into(fragment.theta, self._weights(fragment))

    def _apply(self, fragment: _Fragment, item: Pending | torch.Tensor) -> None:
        """One outer step on ``theta`` with an average as its gradient."""
        if isinstance(item, Pending):
            start = time.perf_counter()
            item = item.wait(self.while_waiting)
            self.wait_s += time.perf_counter() - start
        self.stop = max(self.stop, decode(item[-WIDTH:]))
        fragment.theta.grad = item[:-WIDTH].to(torch.float32).div_(self.world_size)
        fragment.outer.step()
        fragment.theta.grad = None

    def sync(self, stop: int = 0) -> None:
        """A sync point (every rank at once): end every fragment's round early if it took steps
        (carrying ``stop``), apply every pending average in order; every rank then holds ``theta``."""
        for fragment in self.fragments:
            if self._steps_in_round(fragment):
                self._end_round(fragment, keep=0, stop=stop)
            else:
                while fragment.pending:
                    self._apply(fragment, fragment.pending.popleft())
                copy_into(fragment.theta, self._weights(fragment))
        self.steps = 0

    def pending_stop(self) -> int:
        """Wait for the averages in flight (applied later, in order) and return the largest stop signal any of
        them, or an applied one, carried (0: none): at a sync point, a stop asked for in the last round is heard
        before the ranks meet."""
        for fragment in self.fragments:
            for item in self._completed(fragment):
                self.stop = max(self.stop, decode(item[-WIDTH:]))
        return self.stop

    def _completed(self, fragment: _Fragment) -> list[torch.Tensor]:
        """The fragment's averages in flight, each waited for (kept in place, still to be applied)."""
        for i, item in enumerate(fragment.pending):
            if isinstance(item, Pending):
                start = time.perf_counter()
                fragment.pending[i] = item.wait(self.while_waiting)
                self.wait_s += time.perf_counter() - start
        return list(fragment.pending)

    def _steps_in_round(self, fragment: _Fragment) -> int:
        """Inner steps the fragment's current round has taken (its first round ends after
        ``H - offset`` steps, the next every ``H``)."""
        first_end = self.sync_every - fragment.offset
        return self.steps if self.steps < first_end else (self.steps - first_end) % self.sync_every

    @property
    def pending(self) -> int:
        return sum(len(f.pending) for f in self.fragments)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to continue exactly (the same on every rank): each fragment's
        global weights, outer optimizer state, rounds and pending averages (waited for), and the step
        count since the last sync point. The ranks' own weights and inner optimizer states are theirs."""
        fragments = []
        for fragment in self.fragments:
            fragments.append({"theta": fragment.theta.clone(), "outer": fragment.outer.state_dict(),
                              "rounds": fragment.rounds, "pending": [t.clone() for t in self._completed(fragment)]})
        return {"steps": self.steps, "fragments": fragments}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["fragments"]) != len(self.fragments):
            raise ValueError(f"the checkpoint holds {len(state['fragments'])} fragments, this run cuts {len(self.fragments)}")
        self.steps = int(state["steps"])
        for fragment, saved in zip(self.fragments, state["fragments"]):
            with torch.no_grad():
                fragment.theta.copy_(saved["theta"])
            fragment.outer.load_state_dict(saved["outer"])
            fragment.rounds = int(saved["rounds"])
            fragment.pending = deque(self._without_stop(t) for t in saved["pending"])

    @staticmethod
    def _without_stop(average: torch.Tensor) -> torch.Tensor:
        """A saved average without the stop requests it carried (the run that saved it stopped on them)."""
        average = average.clone()
        average[-WIDTH:] = 0
        return average
