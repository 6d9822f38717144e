# Generated from lightning_hybrid/strategies/gradient_sum.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""A LightningModule's training gradient summed over a DataLoader, outside Lightning's loop.

What a cNeural worker computes for the data share of a worker that was lost during a pass
(:class:`~lightning_hybrid.lightning.strategies.cneural.CNeuralStrategy` with ``on_worker_failure="continue"``):
the pass's own sum is built by Lightning's loop, batch by batch; a taken-over share is summed
here, with the same ``training_step`` at the same parameters. The module's ``.grad`` fields are
left alone, and ``self.log`` calls inside ``training_step`` do nothing (outside the loop there is
nowhere to log to). Which parameters got a gradient comes with the sum: a frozen or unused one
(zeros in the sum) is not stepped, as in the pass's own sum.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.data import extract_batch_size


@contextlib.contextmanager
def logging_off(module: pl.LightningModule) -> Iterator[None]:
    """``module.log`` and ``module.log_dict`` do nothing inside the block."""
    module.log = module.log_dict = lambda *args, **kwargs: None
    try:
        yield
    finally:
        del module.log, module.log_dict


def gradient_sum(
    module: pl.LightningModule,
    params: Sequence[torch.Tensor],
    batches: Iterable[Any],
    to_device: Callable[[Any], Any] = lambda batch: batch,
    step_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> tuple[torch.Tensor, int, torch.Tensor]:
    """``(sum over batches of the loss's gradient times the batch's size, samples, has_gradient)``:
    the gradient of ``params`` (flattened, float32, CPU) summed over every sample, when
    ``training_step`` returns a batch's mean loss, and one bool per tensor of ``params``: whether
    it got a gradient from any batch (a parameter with ``requires_grad=False``, or one the loss does
    not use, gets zeros in the sum and False). A batch whose ``training_step`` returns None is
    skipped, as Lightning skips it."""
    total = torch.zeros(sum(p.numel() for p in params), dtype=torch.float32)
    samples = 0
    has = torch.zeros(len(params), dtype=torch.bool)
    trainable = [i for i, p in enumerate(params) if p.requires_grad]
    with logging_off(module), torch.enable_grad():
        for index, batch in enumerate(batches):
            batch = to_device(batch)
            with step_context():
                output = module.training_step(batch, index)
            loss = output["loss"] if isinstance(output, Mapping) else output
            if loss is None:
                continue
            grads: list[torch.Tensor | None] = [None] * len(params)
            if trainable and loss.requires_grad:
                found = torch.autograd.grad(loss, [params[i] for i in trainable], allow_unused=True)
                for i, g in zip(trainable, found):
                    grads[i] = g
            has |= torch.tensor([g is not None for g in grads], dtype=torch.bool)
            flat = torch.cat([
                (g if g is not None else torch.zeros_like(p)).detach().reshape(-1).float().cpu()
                for g, p in zip(grads, params)
            ])
            count = extract_batch_size(batch)
            total.add_(flat, alpha=float(count))
            samples += count
    return total, samples, has
