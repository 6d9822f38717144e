"""Rebuilding the default process group without processes that died.

A gloo group whose member died fails every collective it is part of, and torch.distributed has
no way to drop a member. The survivors of a run that goes on without a dead process
(``on_worker_failure="continue"``) therefore replace the default group, the one Lightning's and
torchmetrics' collectives use, by a new group of the survivors: :func:`regroup`. Ranks in the
new group are the survivors' positions in rank order, so rank 0 stays rank 0 while it lives;
Lightning's own rank attributes keep the original numbering.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_default_store

#: The rendezvous stores of destroyed default groups. In the process of rank 0 that store is the
#: server every group of the run meets through (and the parameter server's channel too): it must
#: outlive the group that created it.
_KEPT_STORES: list[dist.Store] = []

def live_ranks(mask: int) -> list[int]:
    """The ranks whose bit is set in ``mask`` (rank ``r``: ``1 << r``), in order."""
    return [r for r in range(mask.bit_length()) if mask >> r & 1]


def regroup(members: Sequence[int], rank: int, host: str, port: int, key: str, timeout_s: float) -> int:
    """Replace the default process group by one of ``members`` (original ranks, rank order) and
    return this process's rank in it. Every member calls this with the same ``members`` and
    ``key`` (a name no earlier group of the run used); the group meets through the rendezvous
    store at ``host:port``, which the process of rank 0 holds."""
    if rank not in members:
        raise ValueError(f"rank {rank} is not among the members {list(members)} of the new group")
    backend = dist.get_backend() if dist.is_initialized() else "gloo"
    if dist.is_initialized():
        _KEPT_STORES.append(_get_default_store())
        dist.destroy_process_group()
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.PrefixStore(key, dist.TCPStore(host, port, is_master=False, timeout=timeout))
    new_rank = sorted(members).index(rank)
    dist.init_process_group(backend, store=store, rank=new_rank, world_size=len(members), timeout=timeout)
    return new_rank


def regroup_survivors(members: Sequence[int], live_mask: int, rank: int, host: str, port: int, prefix: str,
                      timeout_s: float) -> list[int]:
    """The ranks still alive by ``live_mask`` (:func:`live_ranks`; 0 says nothing: ``members`` stay),
    and, where they are fewer than ``members``, the default group replaced by theirs (:func:`regroup`,
    meeting under ``prefix + "survivors/<their ranks>/"``). Every survivor calls it with the same arguments."""
    survivors = live_ranks(live_mask) if live_mask else list(members)
    if survivors != list(members):
        regroup(survivors, rank, host, port, f"{prefix}survivors/{'-'.join(map(str, survivors))}/", timeout_s)
    return survivors
