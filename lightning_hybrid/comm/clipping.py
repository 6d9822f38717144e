"""Gradient clipping as a value: how a step's gradient was clipped, so that the same clip can be applied to
the ranks' average of it later.

DDP clips the averaged gradient (Lightning clips after DDP's all-reduce). An exchange whose average arrives
after the rank has stepped with its own gradient (delayed gradient averaging, the delayed all-reduce) records
the step's :class:`Clip` and applies it to the average when it arrives, as torch's ``clip_grad_norm_`` and
``clip_grad_value_`` would have to that average (the same formula: per-tensor norms, their norm, a
coefficient ``max_norm / (total + 1e-6)`` capped at 1).

Example::

    >>> import torch
    >>> grads = [torch.tensor([3.0, 4.0])]
    >>> Clip(1.0, "norm").apply(grads); grads[0]
    tensor([0.6000, 0.8000])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

ALGORITHMS = ("norm", "value")


@dataclass(frozen=True)
class Clip:
    """Clip gradients by their total ``norm_type`` norm to ``value`` (``algorithm="norm"``), or each
    element to ``[-value, value]`` (``"value"``)."""

    value: float
    algorithm: str = "norm"
    norm_type: float = 2.0

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")

    def apply(self, grads: Sequence[torch.Tensor]) -> None:
        """Clip ``grads`` in place, as torch's ``clip_grad_norm_`` / ``clip_grad_value_`` clip the
        gradients of parameters whose ``.grad`` they are."""
        grads = [g for g in grads if g.numel()]
        if not grads or self.value <= 0:
            return
        if self.algorithm == "value":
            for g in grads:
                g.clamp_(-self.value, self.value)
            return
        norms = [torch.linalg.vector_norm(g, self.norm_type) for g in grads]
        total = torch.linalg.vector_norm(torch.stack([n.to(grads[0].device) for n in norms]), self.norm_type)
        coefficient = torch.clamp(self.value / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coefficient.to(g.device, g.dtype))
