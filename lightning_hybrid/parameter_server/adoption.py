"""Which surviving worker takes over the data share of a lost one (batch mode, cNeural).

In batch mode every worker's pass covers its own share of the training data (Lightning's
distributed split, or its resident shards). When a worker is lost, its share, and the shares it
had taken over itself, go to the next live worker after it in rank order (wrapping around): its
*adopter*. The rule is a function of the live workers only, so the server and every worker
compute the same answer without a message about it.

Example::

    >>> adopter(1, live={0, 2, 3}, num_workers=4)
    2
    >>> adopted_shares(0, live={0, 2}, num_workers=4)  # 3 wraps around to 0; 1 goes to 2
    [3]
"""

from __future__ import annotations

from collections.abc import Collection


def adopter(lost: int, live: Collection[int], num_workers: int) -> int:
    """The live worker that takes over ``lost``'s share: the next live rank after it, wrapping around."""
    for step in range(1, num_workers + 1):
        rank = (lost + step) % num_workers
        if rank in live and rank != lost:
            return rank
    raise ValueError(f"no live worker is left to take over worker {lost}'s share")


def adopted_shares(worker: int, live: Collection[int], num_workers: int) -> list[int]:
    """The lost workers whose shares ``worker`` (live) covers in its pass."""
    return [r for r in range(num_workers) if r not in live and adopter(r, live, num_workers) == worker]


def shares_of(worker: int, live: Collection[int], num_workers: int) -> list[int]:
    """Every share a pass of ``worker`` covers: its own, then the ones it adopted."""
    return [worker, *adopted_shares(worker, live, num_workers)]
