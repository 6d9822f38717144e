"""Delayed gradient averaging (DGA; Zhu, Lin, Lu, Lin and Han, NeurIPS 2021): each rank steps with its own
gradient at once, and corrects its state by the ranks' average ``delay`` steps later.

A delayed all-reduce that applies only the average, ``delay`` steps late (Pipe-SGD,
:class:`~lightning_hybrid.comm.delayed_allreduce.DelayedAllReduce` on its own), updates every rank with
gradients that are stale by ``delay`` steps: a stale gradient acts as momentum of its own, and at
momentum 0.9 it needed 1.67x DDP's samples (LeNet-5 to 98 %, ``delay=1``). Under DGA the newest gradient in a rank's state is always
its own, computed at its own weights; only what the other ranks contributed arrives late.

A step, as DDP orders it: the backward pass, then :meth:`DelayedGradientAveraging.exchange_gradients`
(the rank's unclipped gradients start their all-reduce, with which parameters have one), then the
caller's gradient clipping of the rank's own gradient, then :meth:`DelayedGradientAveraging.step` in place
of ``optimizer.step()``, told how the gradient was clipped (a :class:`~lightning_hybrid.comm.clipping.Clip`),
so that the average is clipped the same way when it arrives: DDP clips the average. Exactly, for step ``t``
(counted from 0 over the fit) of rank ``r``, whose gradient ``g_t^r`` is computed at its weights of that
moment, with ``avg_s`` the ranks' mean of ``g_s`` clipped by step ``s``'s clip and ``D`` the delay:

* **SGD** (``torch.optim.SGD``, with momentum, dampening, Nesterov, weight decay, maximize; the rule
  ``"sgd"``): after step ``t`` the rank's weights *and momentum buffers* are exactly those of SGD fed the
  gradients ``avg_0, ..., avg_{t-D}, g_{t-D+1}^r, ..., g_t^r`` (each clipped), each step at its own
  learning rate, momentum, dampening, weight decay and Nesterov flag (each recorded when the step is
  taken, so that schedulers that move them, ``OneCycleLR``'s momentum cycle say, stay exact). So the
  ranks differ only by their last ``D`` local gradients, and every momentum buffer holds the average
  wherever it is known. It is done without replaying anything: SGD is linear in its gradients, so
  replacing ``g_s^r`` by ``avg_s`` moves the weights and the buffer by ``a * (avg_s - g_s^r)`` and
  ``b * (avg_s - g_s^r)``, where the scalars ``a, b`` (per parameter group) are SGD's response over
  steps ``s..t`` to a unit change of step ``s``'s gradient (:func:`sgd_response`).
* **Adam and AdamW** (the rule ``"adam"``): the same, for Adam's weights and both moments: after step
  ``t`` they are those of Adam fed ``avg_0, ..., avg_{t-D}, g_{t-D+1}^r, ..., g_t^r``, each step at its
  own learning rate, betas and epsilon (the moments of the average, as DDP's, wherever it is known). The
  weights' response to a gradient goes through the square root of the second moment, so it is not
  linear: the correction takes steps ``s..t`` again from the moments before step ``s`` (kept: one copy
  of both moments, the moments of the oldest step still to be corrected), once with the rank's own
  gradient at ``s`` and once with the average, and the weights move by the difference of the two runs'
  updates (AdamW's decay of the weights between them included): about ten passes over the parameters a
  step per step of delay. Exact up to rounding (2e-5 in the tests); with Adam's L2 ``weight_decay`` (added
  to the gradient; not AdamW's) the decay term of each corrected step stays the one the rank computed at
  its own weights then (measured: within 1.6e-3 of the replay at delay 2, where the replay is 4.9e-3
  from DDP). ``amsgrad=True`` keeps a maximum of the second moment over time that no correction can
  rebuild: it is treated as any other optimizer.
* **Any other optimizer** (the rule ``"update"``): the exchanged value is the rank's *update*
  ``u_t^r = w_before - w_after`` of its own optimizer step, and when the average of step ``s`` arrives
  the weights move by ``u_s^r - avg_s(u)``: the weights are then ``w_0`` minus the ranks' mean updates up
  to ``t - D`` minus the rank's own last ``D``. The optimizer's state stays the rank's own.

Parameters without a gradient are left alone as torch's optimizers leave them: a parameter that no rank
has a gradient for in a step (frozen with ``requires_grad=False``, unused) is not stepped and gets no
correction, so weight decay and momentum never move it. One that some ranks have a gradient for and this
rank has not (conditional computation) is skipped by this rank's own step and corrected, when the average
arrives, as if its gradient had been zero: it misses that one step's weight decay and momentum decay
(DDP gives it the average at once).

``delay=0`` (and each step the exchange is told is ``synchronous``) is DDP for every optimizer: the
average is waited for and written into ``.grad`` before the caller clips it and steps. At a sync point
(:meth:`DelayedGradientAveraging.sync`) every pending average is applied; the ranks' weights and states
are then equal (in exact arithmetic), and rank 0's weights and
optimizer state are broadcast so that they are equal to the bit, and an epoch-end checkpoint, written by
rank 0, resumes every rank exactly. :meth:`DelayedGradientAveraging.settled` gives the weights and state
a sync point would leave rank 0 with, without changing anything (for a checkpoint written between sync
points).

Plain torch.distributed (gloo or NCCL), usable without Lightning::

    dga = DelayedGradientAveraging(optimizer, delay=2)
    for batch in batches:
        loss(batch).backward()
        dga.exchange_gradients()    # the gradients as computed (DDP clips their average)
        clip = Clip(1.0)            # optional: clip this rank's own gradient, and say so
        clip.apply([p.grad for p in model.parameters() if p.grad is not None])
        dga.step(clip=clip)         # in place of optimizer.step()
        optimizer.zero_grad()
    dga.sync()                      # at a sync point: every average applied, every rank the same
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from lightning_hybrid.comm.clipping import Clip
from lightning_hybrid.comm.collectives import broadcast_
from lightning_hybrid.comm.delayed_allreduce import DelayedAllReduce, InFlight, learning_rates
from lightning_hybrid.comm.flat import copy_into, flatten, gradients, slices

RULES = ("sgd", "adam", "update")
#: Each rule's hyperparameters, read from a parameter group at every step (defaults where a group lacks one).
HYPERPARAMETERS = {
    "sgd": {"lr": 0.0, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False, "maximize": False},
    "adam": {"lr": 0.0, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "maximize": False},
    "update": {"lr": 0.0},
}


def rule_of(optimizer: torch.optim.Optimizer) -> str:
    """How DGA corrects ``optimizer``'s state (see the module docstring)."""
    if isinstance(optimizer, torch.optim.SGD):
        return "sgd"
    if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW) and not any(g.get("amsgrad") for g in optimizer.param_groups):
        return "adam"
    return "update"


def hyperparameters(optimizer: torch.optim.Optimizer, rule: str) -> list[dict[str, Any]]:
    """Each parameter group's hyperparameters that ``rule``'s corrections replay, as they are now."""
    wanted = HYPERPARAMETERS[rule]
    groups = []
    for group in optimizer.param_groups:
        values = {k: group.get(k, default) for k, default in wanted.items()}
        values["lr"] = float(values["lr"])
        if rule == "adam":
            values["betas"] = tuple(float(b) for b in values["betas"])
            values["decoupled"] = bool(group.get("decoupled_weight_decay", isinstance(optimizer, torch.optim.AdamW)))
        groups.append(values)
    return groups


def sgd_response(steps: Sequence[Mapping[str, Any]], first: bool, stepped: Sequence[bool] | None = None) -> tuple[float, float]:
    """How a unit change of the gradient of the first of ``steps`` (each step's SGD hyperparameters,
    in order: ``lr``, ``momentum``, ``dampening``, ``weight_decay``, ``nesterov``, ``maximize``) moves
    torch's SGD weights and momentum buffer by the end of the last: ``(a, b)``. ``first``: whether that
    step created the buffer (``buf = grad``, no dampening); ``stepped``: whether the optimizer stepped
    the parameter at each step (a step without its gradient leaves it alone; default: every one).

    Example::

        >>> step = {"lr": 0.1, "momentum": 0.5}
        >>> sgd_response([step, step], first=False)   # -0.1 * (1 + 0.5), 0.5
        (-0.15000000000000002, 0.5)
    """
    stepped = [True] * len(steps) if stepped is None else stepped
    h = steps[0]
    m, damp = h.get("momentum", 0.0), h.get("dampening", 0.0)
    d = -1.0 if h.get("maximize", False) else 1.0  # the change of the step's gradient after weight decay
    buf = (d if first else (1.0 - damp) * d) if m else 0.0
    w = -h["lr"] * ((d + m * buf if h.get("nesterov", False) else buf) if m else d)
    for h, on in zip(steps[1:], stepped[1:]):
        if not on:
            continue
        m, damp = h.get("momentum", 0.0), h.get("dampening", 0.0)
        d = h.get("weight_decay", 0.0) * w
        if m:
            buf = m * buf + (1.0 - damp) * d
            w -= h["lr"] * (d + m * buf if h.get("nesterov", False) else buf)
        else:
            w -= h["lr"] * d
    return w, buf


@dataclass
class _Step:
    """What a correction needs to know of one optimizer step: each group's hyperparameters, which
    parameters the rank's optimizer stepped, how the gradient was clipped, the rank's own (clipped)
    values, and per parameter whether SGD's step created its buffer or Adam's step count after it."""

    hyper: list[dict[str, Any]]
    stepped: list[bool]
    clip: Clip | None = None
    local: torch.Tensor | None = None  # flat: the gradients it stepped with ("sgd", "adam") or its update ("update")
    decay: torch.Tensor | None = None  # "adam" with L2 weight decay: weight_decay * the weights then, flat
    first: list[bool] = field(default_factory=list)  # "sgd"
    counts: list[int] = field(default_factory=list)  # "adam"


class DelayedGradientAveraging:
    """Delayed gradient averaging over ``optimizer``'s parameters (see the module docstring).

    Args:
        optimizer: the torch optimizer (its parameters, in order, are the same on every rank).
        delay: ``D``, steps between a step and the correction by its average.
        bucket_size_mb: the exchange's buckets (one all-reduce each).
        group: the process group (a group of its own: its all-reduces run in the background).
        while_waiting: called while a rank waits for an exchange (see
            :class:`~lightning_hybrid.comm.delayed_allreduce.DelayedAllReduce`).
        rule: how to correct (:data:`RULES`); default: the optimizer's (:func:`rule_of`). ``"update"`` works for
            every optimizer (its state then stays each rank's own: what Adam got before 2026-11-29, kept for
            comparison, ``benchmarks/dga_adam.py``).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, delay: int, bucket_size_mb: float = 25.0,
                 group: dist.ProcessGroup | Sequence[dist.ProcessGroup] | None = None, while_waiting: Callable[[], None] | None = None,
                 rule: str | None = None) -> None:
        self.optimizer = optimizer
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        if rule not in (None, "update", rule_of(optimizer)):
            raise ValueError(f"rule must be None, 'update' or {rule_of(optimizer)!r} for {type(optimizer).__name__}, got {rule!r}")
        self.rule = rule or rule_of(optimizer)
        self.exchange = DelayedAllReduce(self.params, delay, bucket_size_mb, group=group, while_waiting=while_waiting)
        self.delay, self.group = delay, self.exchange.group
        self._group_of = [i for i, g in enumerate(optimizer.param_groups) for _ in g["params"]]
        self._offsets = [0]
        for p in self.params[:-1]:
            self._offsets.append(self._offsets[-1] + p.numel())
        #: Optimizer steps taken so far (the index the next step gets).
        self.steps = 0
        self._history: dict[int, _Step] = {}
        #: Averages applied (as corrections, or stepped with when synchronous).
        self.applied = 0
        self._exchanged: bool | None = None  # this step's exchange: started (False), synchronous and in (True)
        #: "adam": each parameter's moments before the oldest step still to be corrected (None: none pending),
        #: where the correction takes the steps again from (moments rebuilt backwards from the current ones would
        #: not do: where a large new gradient dominates the second moment, rounding loses the old one).
        self._moments_before: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    @property
    def stop(self) -> int:
        """The largest stop signal a completed exchange carried (0: none)."""
        return self.exchange.stop

    @property
    def pending(self) -> int:
        return self.exchange.pending

    # ------------------------------------------------------------------ the step
    def exchange_gradients(self, stop: int = 0, synchronous: bool = False) -> None:
        """After the backward pass, before the gradients are clipped: start this step's exchange of the
        rank's gradients, carrying ``stop`` (this rank's stop request). ``synchronous`` (every step at
        ``delay=0``; warm-up steps): wait for it and write the average into ``.grad`` (None where no rank
        has a gradient), DDP's step. Under the ``"update"`` rule an asynchronous step exchanges its
        update, in :meth:`step`: nothing happens here."""
        synchronous = synchronous or self.delay == 0
        if self._exchanged is not None or (self.rule == "update" and not synchronous):
            return
        if synchronous:
            self._drain()  # nothing is pending before a synchronous step but after a change of delay
        self.exchange.push(stop=stop, tag=self.steps)
        if synchronous:
            item = self.exchange.pop_oldest()
            assert item is not None
            self.exchange.write(item)
        self._exchanged = synchronous

    def step(self, stop: int = 0, synchronous: bool = False, clip: Clip | None = None) -> None:
        """In place of ``optimizer.step()``, after the backward pass (and clipping): this rank's step, its
        exchange started if :meth:`exchange_gradients` did not start it (then of the gradients as they are
        now, carrying ``stop``), and the correction by the average of ``delay`` steps ago once it is in
        (waited for if it is not). ``clip``: how this step's gradient was clipped, applied to its average
        when it arrives. ``synchronous``: this step is DDP's (warm-up steps), as every step is at ``delay=0``."""
        synchronous = synchronous or self.delay == 0
        if self._exchanged is None:
            self.exchange_gradients(stop, synchronous)
        exchanged_average, self._exchanged = self._exchanged, None
        if exchanged_average:
            self.optimizer.step()
            self.applied += 1
        else:
            record = self._record(clip)
            if self.rule == "update":
                before = flatten(self.params).clone()
                self.optimizer.step()
                record.local = before - flatten(self.params)
                self.exchange.push(stop=stop, values=list(slices(record.local, self.params)), tag=self.steps)
            else:
                self.optimizer.step()
            self._history[self.steps] = record
        self.steps += 1
        item = self.exchange.pop_ready()
        if item is not None:
            self._correct(item)

    def _record(self, clip: Clip | None) -> _Step:
        """This step's hyperparameters and the rank's own values, read before the optimizer steps."""
        record = _Step(hyperparameters(self.optimizer, self.rule), [p.grad is not None for p in self.params], clip)
        if self.rule == "update":
            return record
        record.local = flatten(gradients(self.params)).clone()
        states = [self.optimizer.state.get(p, {}) for p in self.params]
        if self.rule == "sgd":
            record.first = [s.get("momentum_buffer") is None for s in states]
        else:
            record.counts = [int(s["step"]) + 1 if "step" in s else 1 for s in states]
            decays = [self.optimizer.param_groups[g]["weight_decay"] if not record.hyper[g]["decoupled"] else 0.0
                      for g in self._group_of]
            if any(decays):
                record.decay = torch.cat([p.detach().reshape(-1) * wd for p, wd in zip(self.params, decays)])
            if self._moments_before is None:  # no step pending: its moments are where corrections start from
                self._moments_before = [self._moments(p, s) for p, s in zip(self.params, states)]
        return record

    @staticmethod
    def _moments(p: torch.Tensor, state: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """A copy of Adam's moments of ``p`` (zeros before its first step)."""
        if "exp_avg" not in state:
            zeros = torch.zeros_like(p, dtype=torch.float32 if p.dtype in (torch.float16, torch.bfloat16) else p.dtype)
            return zeros, zeros.clone()
        return state["exp_avg"].clone(), state["exp_avg_sq"].clone()

    # ------------------------------------------------------------------ corrections
    def _correct(self, item: InFlight) -> None:
        """Apply the average of step ``item.tag`` to this rank's state, as the rule says."""
        self._moments_before = self._apply_correction(item, self.params, lambda p: self.optimizer.state.get(p),
                                                      self._moments_before)
        self.applied += 1
        for k in [k for k in self._history if k <= int(item.tag)]:
            del self._history[k]

    def _apply_correction(self, item: InFlight, params: Sequence[torch.Tensor],
                          state_of: Callable[[torch.Tensor], dict | None],
                          moments: list[tuple[torch.Tensor, torch.Tensor]] | None) -> list | None:
        """Correct ``params`` (the rank's, or copies) and the optimizer state ``state_of`` gives for each
        of the rank's parameters by the average of step ``item.tag``; ``moments``: Adam's before that step
        (not changed); returns them before the next step (None once nothing is pending)."""
        s = int(item.tag)
        record = self._history[s]
        if self.rule == "update":
            with torch.no_grad():
                for p, piece in zip(params, slices(record.local - item.average, self.params)):
                    p.add_(piece.to(p.dtype))
            return moments
        average = item.average.clone()
        used = item.used if item.used is not None else torch.ones(len(self.params), dtype=torch.bool)
        if record.clip is not None:
            record.clip.apply([piece for piece, on in zip(slices(average, self.params), used) if on])
        delta = average - record.local
        steps = [self._history[k] for k in range(s, self.steps)]
        responses: dict[tuple, tuple[float, ...]] = {}
        moments = list(moments) if moments is not None else None
        with torch.no_grad():
            for i, (p, own, piece) in enumerate(zip(self.params, params, slices(delta, self.params))):
                if not used[i]:
                    continue  # no rank had a gradient for it: nobody stepped it, nothing to correct
                g = self._group_of[i]
                stepped = tuple(step.stepped[i] for step in steps)
                if self.rule == "sgd":
                    key = (g, steps[0].first[i], stepped)
                    if key not in responses:
                        responses[key] = sgd_response([step.hyper[g] for step in steps], steps[0].first[i], stepped)
                    self._correct_sgd(own, state_of(p), piece, *responses[key])
                else:
                    assert moments is not None
                    moments[i] = self._correct_adam(i, own, state_of(p), piece, steps, moments[i])
        return moments if len(steps) > 1 else None

    @staticmethod
    def _correct_sgd(param: torch.Tensor, state: dict | None, delta: torch.Tensor, a: float, b: float) -> None:
        param.add_(delta.to(param.dtype), alpha=a)
        buffer = state.get("momentum_buffer") if state else None
        if buffer is not None and b:
            buffer.add_(delta.to(buffer.dtype), alpha=b)

    def _correct_adam(self, i: int, param: torch.Tensor, state: dict | None, delta: torch.Tensor,
                      steps: Sequence[_Step], before: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Adam's state and weights as if step ``s`` (the first of ``steps``, the rest the rank's own since)
        had taken the average: steps ``s..t`` taken again from the moments ``before`` step ``s``, once with
        the rank's own gradient at ``s`` (what it did) and once with the average; the moments become the
        second run's, and the weights move by the difference of the two runs' updates (AdamW's decay of
        the weights between them included). ``delta``: the average minus the rank's own gradient of step
        ``s``. Returns the moments before step ``s + 1``, the average's."""
        if not state or "exp_avg" not in state:
            return before
        g = self._group_of[i]
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        sign = -1.0 if steps[0].hyper[g]["maximize"] else 1.0
        (m_own, v_own), (m, v) = before, before
        moved = torch.zeros_like(exp_avg)
        after_first = before
        for k, step in enumerate(steps):
            h = step.hyper[g]
            if not (step.stepped[i] or k == 0):
                continue
            e = self._piece(step.local, i).to(exp_avg.dtype) * (-1.0 if h["maximize"] else 1.0)
            if step.decay is not None:
                e = e + self._piece(step.decay, i).to(exp_avg.dtype)
            beta1, beta2 = h["betas"]
            if h["decoupled"] and step.stepped[i]:
                moved.mul_(1.0 - h["lr"] * h["weight_decay"])
            if step.stepped[i]:
                m_own, v_own = beta1 * m_own + (1.0 - beta1) * e, beta2 * v_own + (1.0 - beta2) * e * e
                moved.add_(self._adam_update(m_own, v_own, h, step.counts[i]))
            if k == 0:
                e = e + sign * delta.to(e.dtype)
            m, v = beta1 * m + (1.0 - beta1) * e, beta2 * v + (1.0 - beta2) * e * e
            moved.sub_(self._adam_update(m, v, h, step.counts[i]))
            if k == 0:
                after_first = (m, v)
        exp_avg.copy_(m)
        exp_avg_sq.copy_(v)
        param.add_(moved.to(param.dtype))
        return after_first

    @staticmethod
    def _adam_update(m: torch.Tensor, v: torch.Tensor, h: Mapping[str, Any], count: int) -> torch.Tensor:
        """What Adam's step subtracts from the weights given its moments after the step (torch's formula)."""
        beta1, beta2 = h["betas"]
        denominator = (v.sqrt() / (1.0 - beta2 ** count) ** 0.5).add_(h["eps"])
        return m / denominator * (h["lr"] / (1.0 - beta1 ** count))

    def _piece(self, flat: torch.Tensor, i: int) -> torch.Tensor:
        """Parameter ``i``'s piece of a flat vector laid out as the parameters."""
        start, p = self._offsets[i], self.params[i]
        return flat[start : start + p.numel()].view_as(p)

    def _drain(self) -> None:
        while (item := self.exchange.pop_oldest()) is not None:
            self._correct(item)

    # ------------------------------------------------------------------ sync points
    def sync(self) -> None:
        """At a sync point (every rank at once): apply every pending average, then take rank 0's
        weights and optimizer state to the bit (one broadcast of each)."""
        self._drain()
        self._history.clear()
        self._moments_before = None
        source = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        weights = flatten(self.params)
        broadcast_(weights, src=source, group=self.group)
        copy_into(weights, self.params)
        state = self._state_tensors(lambda p: self.optimizer.state.get(p, {}))
        if state:
            flat = flatten(state, dtype=torch.float64)
            broadcast_(flat, src=source, group=self.group)
            copy_into(flat, state)

    def _state_tensors(self, state_of: Callable[[torch.Tensor], dict]) -> list[torch.Tensor]:
        return [t for p in self.params for _, t in sorted(state_of(p).items())
                if isinstance(t, torch.Tensor) and t.is_floating_point()]

    def settled(self) -> tuple[dict[torch.Tensor, torch.Tensor], dict[torch.Tensor, dict[str, Any]]]:
        """The weights and optimizer state this rank would hold after applying every pending average, as
        copies keyed by parameter; nothing of the rank's changes (the exchanges in flight are waited for)."""
        weights = [p.detach().clone() for p in self.params]
        states = {p: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in self.optimizer.state.get(p, {}).items()}
                  for p in self.params}
        moments = self._moments_before
        for item in self.exchange.pending_items():
            moments = self._apply_correction(item, weights, states.get, moments)
        return dict(zip(self.params, weights)), states

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """This rank's pending exchanges (waited for: the averages) and the steps they need to be
        applied (its own values among them): with the rank's weights and optimizer state, what a
        checkpoint written between sync points must hold so that a resumed run corrects as this one would."""
        return {"steps": self.steps, "rule": self.rule, "pending": self.exchange.pending_state(),
                "history": {k: vars(v) for k, v in self._history.items()}, "moments_before": self._moments_before}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("rule", self.rule) != self.rule:
            raise ValueError(f"the checkpoint's delayed averaging corrected by the rule {state['rule']!r}; this optimizer "
                             f"needs {self.rule!r} (the optimizer changed between the runs)")
        self.steps = int(state["steps"])
        self.exchange.load_pending_state(state["pending"])
        self._history = {int(k): _Step(**v) for k, v in state["history"].items()}
        self._moments_before = state.get("moments_before")

