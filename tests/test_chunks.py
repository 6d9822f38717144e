"""Dealing an epoch's batches: every sample once, dynamic or in DDP's global-batch order."""

from __future__ import annotations

import torch

from lightning_hybrid.parameter_server.dispenser import ChunkDispenser


def drain(dispenser: ChunkDispenser, order: list[int]) -> dict[int, list[torch.Tensor]]:
    taken: dict[int, list[torch.Tensor]] = {}
    finished: set[int] = set()
    for w in order * 1000:
        if w in finished:
            continue
        chunk = dispenser.next_chunk(w)
        if chunk is None:
            finished.add(w)
            if len(finished) == dispenser.num_workers:
                break
        else:
            taken.setdefault(w, []).append(chunk)
    return taken


def test_dynamic_every_sample_once_and_fast_takes_more():
    d = ChunkDispenser(num_samples=1000, batch_size=32, num_workers=2, seed=3)
    for epoch in range(2):
        d.start_epoch(epoch)
        taken = drain(d, [0, 0, 0, 1])  # worker 0 asks three times as often
        everything = torch.cat([c for chunks in taken.values() for c in chunks])
        assert sorted(everything.tolist()) == list(range(1000))
        assert len(taken[0]) > 2 * len(taken[1])


def test_epoch_order_matches_distributed_sampler():
    d = ChunkDispenser(num_samples=64, batch_size=8, num_workers=2, seed=5, dynamic=False)
    d.start_epoch(2)
    expected = torch.randperm(64, generator=torch.Generator().manual_seed(5 + 2))
    first_round = torch.cat([d.next_chunk(1), d.next_chunk(0)])
    assert sorted(first_round.tolist()) == sorted(expected[:16].tolist())  # one DDP global batch


def test_static_is_independent_of_request_order():
    a = ChunkDispenser(num_samples=100, batch_size=10, num_workers=3, dynamic=False)
    b = ChunkDispenser(num_samples=100, batch_size=10, num_workers=3, dynamic=False)
    a.start_epoch(0)
    b.start_epoch(0)
    ta, tb = drain(a, [0, 1, 2]), drain(b, [2, 2, 1, 0])
    for w in range(3):
        assert [c.tolist() for c in ta[w]] == [c.tolist() for c in tb[w]]


def test_drop_last_and_cap():
    d = ChunkDispenser(num_samples=100, batch_size=30, num_workers=2, drop_last=True)
    assert d.num_chunks == 3
    d = ChunkDispenser(num_samples=100, batch_size=10, num_workers=2, max_chunks=4)
    d.start_epoch(0)
    assert sum(len(v) for v in drain(d, [0, 1]).values()) == 4


def test_unshuffled_dealing_repeats_the_same_batches_in_order():
    """shuffle=False (a sequential sampler, overfit_batches): chunks 0, 1, 2, ... of 0..n-1, every epoch."""
    d = ChunkDispenser(num_samples=40, batch_size=8, num_workers=2, max_chunks=4, shuffle=False)
    for epoch in (0, 1):
        d.start_epoch(epoch)
        chunks = [d.next_chunk(w).tolist() for w in (0, 1, 0, 1)]
        assert chunks == [list(range(8 * k, 8 * k + 8)) for k in range(4)]
        assert d.next_chunk(0) is None
