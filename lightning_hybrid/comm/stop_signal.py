"""A stop request carried in an exchange's own buffer, so that ranks that meet only at their exchanges
agree on a stop there, and nowhere else.

A rank appends :func:`encode` of the signal it was asked to stop on (0: none) to what it all-reduces;
the sum over the ranks, read by :func:`decode`, is the largest signal any rank asked for (SIGTERM over
SIGUSR2 over SIGINT, by number), the same on every rank, read at the same step. The flags are one
count per signal number (:data:`WIDTH` of them: 260 bytes in fp32), summed like the gradients beside
them; counts up to 256 ranks stay exact in bf16.

Example::

    >>> import signal
    >>> decode(encode(signal.SIGTERM) + encode(0) + encode(signal.SIGINT)) == signal.SIGTERM
    True
"""

from __future__ import annotations

import signal

import torch

#: One flag per signal number, 0 (none) included.
WIDTH = max(int(s) for s in signal.valid_signals()) + 1


def encode(signum: int, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
    """This rank's request as flags: a one at ``signum`` (nothing for 0)."""
    flags = torch.zeros(WIDTH, dtype=dtype, device=device)
    if signum:
        flags[int(signum)] = 1
    return flags


def decode(summed: torch.Tensor) -> int:
    """The largest signal some rank asked for, from the ranks' flags summed (0: none)."""
    asked = torch.nonzero(summed.detach().float().cpu()[1:] > 0.5)
    return int(asked.max().item()) + 1 if asked.numel() else 0
