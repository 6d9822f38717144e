"""Which parameter tensors had a gradient: in a worker's push, and in the pushes that make up a server step.

torch's optimizers skip a parameter whose ``.grad`` is None (frozen with ``requires_grad=False``, or
unused in the step), and DDP keeps that: a parameter that got no gradient on any rank is not stepped
(neither weight decay nor momentum move it), one that got a gradient on some ranks gets their average
(zeros from the others). A worker pushes a flat gradient, zeros where ``.grad`` is None, and the server
keeps every parameter's ``.grad`` as a view of one flat buffer, so the pushed vector alone cannot
say which parameters had none. Each push therefore carries a per-tensor mask (:func:`has_gradient`;
the client sends it only when some tensor had no gradient, so a model whose parameters all have one
pushes what it pushed before), the server ORs the masks of the pushes it averages into one step
(:class:`PushedTensors`) and steps only those tensors (:func:`stepping_only`).

Example::

    >>> import torch
    >>> a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(1))
    >>> a.grad = torch.zeros(2)
    >>> has_gradient([a, b])
    tensor([ True, False])
    >>> pushed = PushedTensors()
    >>> pushed.add(torch.tensor([True, False])); pushed.add(torch.tensor([False, False]))
    >>> pushed.take()
    tensor([ True, False])
    >>> pushed.add(None); pushed.take() is None  # a push without a mask: every tensor had a gradient
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch


def has_gradient(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """One bool per tensor of ``params``: whether its ``.grad`` is set."""
    return torch.tensor([p.grad is not None for p in params], dtype=torch.bool)


class PushedTensors:
    """The OR of the masks of the pushes that make up one step (a push without a mask: every tensor)."""

    def __init__(self) -> None:
        self._mask: torch.Tensor | None = None
        self._every = False

    def add(self, mask: torch.Tensor | None) -> None:
        """One more push: ``mask`` (one bool per tensor), or None when every tensor had a gradient."""
        if self._every:
            return
        if mask is None:
            self._every, self._mask = True, None
        elif self._mask is None:
            self._mask = mask.clone()
        else:
            self._mask |= mask

    def take(self) -> torch.Tensor | None:
        """The tensors that had a gradient in any push since the last take, or None when all did; resets."""
        mask = None if self._every or self._mask is None or bool(self._mask.all()) else self._mask
        self._mask, self._every = None, False
        return mask


def received_mask(worker: int, tensors: int, held: int, payload) -> torch.Tensor | None:
    """The mask of ``tensors`` tensors that ``worker``'s push brings, next in its ``payload`` (a copy), or None
    when it brings none (every tensor had a gradient); a RuntimeError unless it covers the ``held`` tensors."""
    if tensors and tensors != held:
        raise RuntimeError(f"worker {worker} pushed a mask of {tensors} parameter tensors; the server holds {held}")
    return payload.take(torch.uint8, tensors).bool() if tensors else None


@contextlib.contextmanager
def stepping_only(params: Sequence[torch.Tensor], mask: torch.Tensor | None) -> Iterator[None]:
    """Inside the block, the ``.grad`` of each tensor of ``params`` whose entry of ``mask`` is False is
    None (an optimizer's step skips it); the same ``.grad`` objects (the server's views of its flat
    gradient buffer) are back afterwards. ``mask`` None: every tensor keeps its gradient."""
    skipped = [] if mask is None else [(p, p.grad) for p, has in zip(params, mask.tolist()) if not has]
    for p, _ in skipped:
        p.grad = None
    try:
        yield
    finally:
        for p, grad in skipped:
            p.grad = grad
