"""The single-device reference of the pipeline tests (tests/strategies/test_hybrid_strategy.py and
tests/gpu): full-batch training of tests/support/hybrid_script.py's module and data, and the check that a
trained module holds a state."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hybrid_script import make_data, make_module


def reference_steps(samples: int, steps: int, lr: float = 0.1, momentum: float = 0.0, clip: float | None = None,
                    model: str = "lenet5"):
    """Single-device full-batch training: (first loss, first gradients, module after ``steps``)."""
    module = make_module(lr, momentum, model)
    x, y = make_data(samples, model).tensors
    optimizer = torch.optim.SGD(module.parameters(), lr=lr, momentum=momentum)
    first = None
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(module(x), y)
        loss.backward()
        if first is None:
            first = (loss.item(), {n: p.grad.clone() for n, p in module.named_parameters()})
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
        optimizer.step()
    return first[0], first[1], module


def assert_state_equal(module: nn.Module, state: dict[str, torch.Tensor], atol: float = 1e-5) -> None:
    for name, value in module.state_dict().items():
        torch.testing.assert_close(state[name], value, atol=atol, rtol=1e-4, msg=name)
