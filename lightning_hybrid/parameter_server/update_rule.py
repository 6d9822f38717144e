"""How the parameter server turns asynchronous pushes into optimizer steps (plain Python and torch).

Applying every push as a full optimizer step at the user's learning rate (the rule of a plain
parameter server) makes ``n`` workers take ``n`` steps of one worker's mini-batch where DDP takes one
step of their average, and momentum piles stale gradients on top: an epoch of SSP was then worth far
less than an epoch of DDP. :class:`UpdateRule` applies what the literature established, each part
switchable for comparison:

* **An effective batch matching DDP's** (``pushes_per_update``, default: one push per worker): the
  server averages pushes until it holds that many, then takes one optimizer step, so the user's
  learning rate keeps DDP's meaning (one step on ``workers x batch`` samples) and an SSP epoch takes
  as many steps as a DDP epoch.
* **Staleness-aware learning rate** (``staleness_lr``; Zhang, Gupta, Lian, Liu 2016): a gradient
  computed ``tau`` optimizer steps ago counts ``1 / tau`` (``tau >= 1``) in the average, so very stale
  gradients move the parameters less. A gradient at most one step old counts fully.
* **Momentum corrected for asynchrony** (``momentum_correction``; Mitliagkas, Zhang, Hadjis, Re 2016,
  "Asynchrony begets momentum"): staleness acts like extra momentum. Momentum ``mu`` applies each
  gradient, on average, ``mu / (1 - mu)`` steps after it was computed; a gradient ``tau`` steps
  stale arrives ``tau`` steps late on top. The default (``"mean_delay"``) lowers SGD's momentum so
  that the mean delay of the whole update stays the configured one:
  ``mu' / (1 - mu') = mu / (1 - mu) - E[tau]`` (never below 0), where ``E[tau]`` is a running mean of
  the measured staleness, each weighted as its gradient is in the step (a gradient that counts
  ``1 / tau`` adds less). At ``mu = 0.9`` (a mean delay of 9 steps) a mean staleness of 0.25 gives
  ``mu' = 0.897``: a gradient or two of the restart after a sync, or a straggler's, hardly matter; a
  fully asynchronous run whose gradients are 4 steps stale on average gets ``mu' = 0.83``, one 9 or
  more steps stale none. ``"subtract"`` is the paper's first-order reading, ``mu' = mu - E[tau] / (1 +
  E[tau])`` (the implicit momentum of a geometric staleness), the rule before 2026-11-24: at
  ``mu = 0.9`` it removes far more (0.7 for the same 0.25), which also shrinks the long-run step
  ``lr / (1 - mu)`` threefold. Measured (LeNet-5, MNIST, batch 64 per worker, lr 0.02, momentum
  0.9, one worker 4x slower, 3 seeds, one invocation each): epochs to 98 % test accuracy, DDP 5,
  ``"mean_delay"`` 7 (2 workers) and 6 (4 workers), ``"subtract"`` 11 and 9. At lr 0.05, a rate at
  which DDP's own crossing of 98 % spreads over 4-10 epochs, the subtraction's smaller step helped
  at 2 workers (6 epochs against 7): a learning-rate cut, not a correction for asynchrony.
  The staleness of the pushes in the first ``restart_steps`` steps after each global
  synchronization (:meth:`synchronized`) is left out of the mean: a transient of the restart, not
  the steady asynchrony the correction is for.

With ``pushes_per_update=1``, ``staleness_lr=False`` and ``momentum_correction=False`` every push is
a step at the user's learning rate and momentum (the rule before, and Zhang et al. 2017's).

With staleness 0 there is no rule: each round (every worker's push, or in batch mode its pass's
sum) is one step of the pushes' weighted mean (:class:`RoundSum`).

A step has a gradient for the tensors that had one in any of the pushes averaged into it
(``stepped``, read after ``take_average``); the server steps only those, as DDP does
(:mod:`~lightning_hybrid.parameter_server.gradient_mask`).

Example::

    >>> import torch
    >>> rule = UpdateRule(pushes_per_update=2)
    >>> rule.add(torch.ones(3), staleness=0), rule.add(torch.full((3,), 3.0), staleness=1)
    (False, True)
    >>> rule.take_average()
    tensor([2., 2., 2.])
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lightning_hybrid.parameter_server.gradient_mask import PushedTensors

#: How ``momentum_correction`` lowers SGD's momentum (see the module docstring); ``True`` is the first.
MOMENTUM_CORRECTIONS = ("mean_delay", "subtract")


@dataclass
class UpdateRule:
    """Accumulates pushed gradients and says when to step (see the module docstring).

    Args:
        pushes_per_update: pushes (each weighted by its ``weight``: 1 per mini-batch) averaged into one
            optimizer step.
        staleness_lr: weight each gradient by ``1 / max(1, staleness)``.
        momentum_correction: lower SGD's momentum for the measured staleness: ``"mean_delay"`` (or
            ``True``), ``"subtract"``, or ``False`` (see the module docstring).
        staleness_decay: weight of the newest staleness in its running mean.
        restart_steps: steps after each global synchronization (and after the start) whose pushes'
            staleness the running mean leaves out.
    """

    pushes_per_update: int = 1
    staleness_lr: bool = False
    momentum_correction: bool | str = False
    staleness_decay: float = 0.05
    restart_steps: int = 0
    mean_staleness: float = field(default=0.0, init=False)
    _weighted_staleness: float = field(default=0.0, init=False, repr=False)
    _weights: float = field(default=0.0, init=False, repr=False)
    _sum: torch.Tensor | None = field(default=None, init=False, repr=False)
    _weight: int = field(default=0, init=False)
    _steps_since_sync: int = field(default=0, init=False, repr=False)
    _pushed: PushedTensors = field(default_factory=PushedTensors, init=False, repr=False, compare=False)
    #: After :meth:`take_average`: the tensors that had a gradient in any push averaged into it (one
    #: bool each), or None when every tensor had one.
    stepped: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.pushes_per_update, bool) or not isinstance(self.pushes_per_update, int) or self.pushes_per_update < 1:
            raise ValueError(f"pushes_per_update must be a positive integer, got {self.pushes_per_update!r}")
        if not 0 < self.staleness_decay <= 1:
            raise ValueError(f"staleness_decay must be in (0, 1], got {self.staleness_decay}")
        if self.momentum_correction is True:
            self.momentum_correction = MOMENTUM_CORRECTIONS[0]
        if self.momentum_correction is not False and self.momentum_correction not in MOMENTUM_CORRECTIONS:
            raise ValueError(
                f"momentum_correction must be one of {', '.join(map(repr, MOMENTUM_CORRECTIONS))}, True or False, "
                f"got {self.momentum_correction!r}"
            )
        if isinstance(self.restart_steps, bool) or not isinstance(self.restart_steps, int) or self.restart_steps < 0:
            raise ValueError(f"restart_steps must be a non-negative integer, got {self.restart_steps!r}")

    @property
    def pending(self) -> int:
        """Pushes (weights) accumulated since the last step."""
        return self._weight

    def add(self, gradient: torch.Tensor, staleness: int, weight: int = 1, has_gradient: torch.Tensor | None = None) -> bool:
        """Accumulate a pushed gradient (the mean over its mini-batch) computed ``staleness`` optimizer
        steps ago, which had a gradient for the tensors ``has_gradient`` says (None: all); return
        whether a step is due."""
        self._pushed.add(has_gradient)
        scale = weight / max(1, staleness) if self.staleness_lr else weight
        if self._steps_since_sync >= self.restart_steps:
            # The implicit momentum comes from the updates as applied: each staleness counts with the
            # weight its gradient gets in the step.
            self._weighted_staleness += self.staleness_decay * (scale * staleness - self._weighted_staleness)
            self._weights += self.staleness_decay * (scale - self._weights)
            self.mean_staleness = self._weighted_staleness / self._weights
        if self._sum is None or self._sum.shape != gradient.shape:
            # allocated once (no page faults per step), where the server keeps its parameters
            self._sum = torch.empty(gradient.shape, dtype=torch.float32, device=gradient.device)
        if self._weight == 0:  # the step's first push: written, not added (nothing to zero)
            torch.mul(gradient, float(scale), out=self._sum)
        else:
            self._sum.add_(gradient, alpha=float(scale))
        self._weight += weight
        return self._weight >= self.pushes_per_update

    def take_average(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The accumulated gradients' weighted mean (divided by the pushes' total weight), into ``out``
        when given (no allocation); resets. The tensors it has a gradient for: :attr:`stepped`."""
        average = torch.div(self._sum, self._weight, out=out) if out is not None else self._sum / self._weight
        self.stepped = self._pushed.take()
        self._weight = 0
        self._steps_since_sync += 1
        return average

    def synchronized(self) -> None:
        """Every worker now holds the same parameters (a global synchronization): the pushes of the
        next ``restart_steps`` steps are the restart's, not counted in the mean staleness."""
        self._steps_since_sync = 0

    def momentum(self, configured: float) -> float:
        """The explicit momentum to use for a configured one."""
        if not self.momentum_correction or configured >= 1.0:
            return configured
        if self.momentum_correction == "subtract":
            return max(0.0, configured - self.mean_staleness / (1.0 + self.mean_staleness))
        delay = configured / (1.0 - configured) - self.mean_staleness  # the mean delay left to momentum
        return delay / (1.0 + delay) if delay > 0 else 0.0


class RoundSum:
    """Staleness 0: a round's pushes, each a gradient times its weight (1 per mini-batch, or a pass's
    samples in batch mode), summed until the round is complete; its step takes their weighted mean."""

    def __init__(self, like: torch.Tensor) -> None:
        self._sum = torch.zeros_like(like)
        self.weight = 0
        self._pushed = PushedTensors()
        #: After :meth:`take_average`: the tensors with a gradient in the round (as :attr:`UpdateRule.stepped`).
        self.stepped: torch.Tensor | None = None

    def add(self, gradient: torch.Tensor, weight: int, has_gradient: torch.Tensor | None = None) -> None:
        """A push (``gradient`` already times ``weight``), with a gradient for the tensors ``has_gradient`` says."""
        self._sum += gradient
        self.weight += weight
        self._pushed.add(has_gradient)

    def take_average(self, out: torch.Tensor) -> bool:
        """The round's weighted mean into ``out``, unless it holds no weight: whether it did; resets."""
        self.stepped = self._pushed.take()
        stepping = self.weight > 0
        if stepping:
            torch.div(self._sum, self.weight, out=out)
        self._sum.zero_()
        self.weight = 0
        return stepping
