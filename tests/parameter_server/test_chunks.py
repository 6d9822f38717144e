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


def trained_indices(dispenser: ChunkDispenser, worker: int, chunks: list[torch.Tensor], count: int) -> list[int]:
    """Report ``worker``'s first ``count`` chunks trained; their sample indices."""
    dispenser.trained(worker, count)
    return torch.cat(chunks[:count]).tolist() if count else []


def test_a_lost_workers_untrained_chunks_are_dealt_again_first():
    d = ChunkDispenser(num_samples=200, batch_size=10, num_workers=3, seed=1)
    d.start_epoch(0)
    dealt = {w: [d.next_chunk(w) for _ in range(3)] for w in (0, 1, 2)}
    used = trained_indices(d, 1, dealt[1], 1)  # worker 1 trained one of its three chunks, then died
    assert d.held(1) == 2
    assert d.lose(1) == 2
    assert d.next_chunk(1) is None  # a lost worker gets nothing more
    again = [d.next_chunk(2), d.next_chunk(0)]
    assert [c.tolist() for c in again] == [c.tolist() for c in dealt[1][1:]]
    rest = drain_members(d, [0, 2])
    everything = used + [i for w in (0, 2) for c in dealt[w] for i in c.tolist()]
    everything += [i for c in again for i in c.tolist()] + [i for c in rest for i in c.tolist()]
    assert sorted(everything) == list(range(200))


def drain_members(dispenser: ChunkDispenser, members: list[int]) -> list[torch.Tensor]:
    out, finished = [], set()
    while len(finished) < len(members):
        for w in members:
            if w not in finished:
                chunk = dispenser.next_chunk(w)
                if chunk is None:
                    finished.add(w)
                else:
                    out.append(chunk)
    return out


def test_static_dealing_after_a_loss_covers_the_epoch_and_then_deals_rounds_of_the_survivors():
    d = ChunkDispenser(num_samples=120, batch_size=10, num_workers=3, seed=2, dynamic=False)
    d.start_epoch(0)
    first = {w: d.next_chunk(w) for w in (0, 1, 2)}
    d.trained(0)
    d.trained(2)
    assert d.lose(1) == 1  # its chunk was never trained
    later = drain_members(d, [0, 2])
    epoch = [first[0], first[2], *later]
    assert sorted(torch.cat(epoch).tolist()) == list(range(120))
    d.start_epoch(1)  # from the next epoch: rounds of one chunk per survivor, DDP's global-batch order
    order = torch.randperm(120, generator=torch.Generator().manual_seed(2 + 1))
    assert d.next_chunk(2).tolist() == order[10:20].tolist()
    assert d.next_chunk(0).tolist() == order[0:10].tolist()
    assert d.next_chunk(1) is None


def test_segments_follow_ddps_validation_points_and_the_last_holds_a_chunk_per_worker():
    from lightning_hybrid.parameter_server.dispenser import segment_chunks

    assert segment_chunks(0.25, num_chunks=20, workers=2) == 4  # a quarter of each worker's 10 batches: 2
    assert segment_chunks(3, num_chunks=20, workers=2) == 6  # every 3 batches of each worker
    assert segment_chunks(1.0, num_chunks=20, workers=2) == 0 and segment_chunks(10, num_chunks=20, workers=2) == 0
    d = ChunkDispenser(num_samples=19 * 8, batch_size=8, num_workers=2, segment_chunks=6)
    # 19 chunks: segments 0-5, 6-11, 12-18 (a last segment of 1 chunk could not give each worker one)
    assert [d.segment_of(i) for i in (0, 5, 6, 11, 12, 17, 18)] == [0, 0, 1, 1, 2, 2, 2]
    d.start_epoch(0)
    segments = []
    while d.next_chunk(len(segments) % 2) is not None:
        segments.append(d.last_segment)
    assert segments == [0] * 6 + [1] * 6 + [2] * 7


def test_exhausted_once_every_chunk_is_dealt():
    """The server tells a max_steps stop inside an epoch from one at its end by this."""
    for dynamic in (True, False):
        d = ChunkDispenser(40, 10, 2, seed=0, dynamic=dynamic)
        d.start_epoch(0)
        dealt = 0
        while not d.exhausted():
            assert d.next_chunk(dealt % 2) is not None
            dealt += 1
        assert dealt == 4 and d.next_chunk(0) is None and d.next_chunk(1) is None
