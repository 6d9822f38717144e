"""The small model and the per-rank batches that the exchanges of tests/comm/ train on (tests/comm/test_delayed_allreduce.py,
tests/comm/test_local_sgd.py): the same model and batches in both, so that their runs compare."""

from __future__ import annotations

import torch


def batches(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 5, generator=g), torch.randn(8, 2, generator=g)


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
