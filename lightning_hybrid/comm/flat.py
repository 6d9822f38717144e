"""Parameters and gradients as one flat buffer: what travels between workers and servers.

The parameter server, its workers and the delayed all-reduce all move a model's tensors as one
flat vector in a fixed order (the optimizer's parameter order). These functions are the only
place that lays tensors out that way and back.

Example::

    >>> import torch
    >>> a, b = torch.zeros(2), torch.zeros(1, 2)
    >>> copy_into(torch.arange(4.0), [a, b]); b
    tensor([[2., 3.]])
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch


def flatten(tensors: Sequence[torch.Tensor], dtype: torch.dtype | None = None,
            device: torch.device | str | None = None) -> torch.Tensor:
    """The tensors, in order, as one new flat tensor (on ``device`` in ``dtype`` when given)."""
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    return flat.to(device=device, dtype=dtype) if dtype is not None or device is not None else flat


def gradients(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each parameter's ``.grad``, or zeros where it has none."""
    return [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]


def slices(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> Iterator[torch.Tensor]:
    """Views of consecutive pieces of ``flat``, each shaped like the next tensor of ``like``."""
    offset = 0
    for t in like:
        n = t.numel()
        yield flat[offset : offset + n].view_as(t)
        offset += n


def copy_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Overwrite each tensor with its piece of ``flat`` (converted to the tensor's device and dtype)."""
    with torch.no_grad():
        for tensor, piece in zip(tensors, slices(flat, tensors)):
            tensor.copy_(piece)


def flatten_in_place(params: Sequence[torch.Tensor], device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Move ``params`` into one flat float32 buffer on ``device`` (their ``.data`` become views of
    it), and give each a ``.grad`` that is a view of a second flat buffer; return both buffers."""
    flat_params = flatten(params, dtype=torch.float32, device=device)  # a new tensor (torch.cat)
    flat_grads = torch.zeros_like(flat_params)
    for p, data, grad in zip(params, slices(flat_params, params), slices(flat_grads, params)):
        p.data = data
        p.grad = grad
    return flat_params, flat_grads
