"""BatchCounts on a real store, ranks as threads of one process (the check talks to the store only)."""

from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch.distributed as dist

from conftest import free_port
from lightning_hybrid.comm.batch_counts import BatchCounts, UnevenBatchesError
from lightning_hybrid.comm.board import Board


@pytest.fixture
def boards():
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=30))
    yield lambda: Board("test/", host="127.0.0.1", port=port)
    del server


def agree_on_threads(counts: list[BatchCounts]) -> list[BaseException | None]:
    errors: list[BaseException | None] = [None] * len(counts)

    def agree(rank: int) -> None:
        try:
            counts[rank].agree()
        except BaseException as err:  # noqa: BLE001 (handed to the test)
            errors[rank] = err

    threads = [threading.Thread(target=agree, args=(r,)) for r in range(len(counts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return errors


def test_equal_counts_agree_again_and_again_and_uneven_ones_end_on_every_rank(boards):
    counts = [BatchCounts(r, 2, boards(), timeout_s=10, fix="give every rank as many") for r in range(2)]
    for sync in range(4):  # equal counts, every sync point (the store's old keys deleted on the way)
        for c in counts:
            c.count(5 + sync)
        assert agree_on_threads(counts) == [None, None]
        assert [c.batches for c in counts] == [0, 0]
    counts[0].count(3)
    counts[1].count(4)
    errors = agree_on_threads(counts)
    for err in errors:
        assert isinstance(err, UnevenBatchesError)
        assert "(rank 0: 3, rank 1: 4)" in str(err) and str(err).endswith(": give every rank as many")


def test_a_rank_waiting_for_a_peer_whose_data_ended_learns_it_and_tells_it(boards):
    """Rank 0 posts 3 batches and waits at its sync point; rank 1, waiting for an exchange of its 4th batch
    that rank 0 will never start, raises (saying 4 or more) and rank 0, reading that, raises too."""
    counts = [BatchCounts(r, 2, boards(), timeout_s=10) for r in range(2)]
    counts[1].count(3)
    counts[1].check_peers()  # nobody ended: a wait goes on
    counts[0].count(3)
    errors: list[BaseException | None] = []
    waiter = threading.Thread(target=lambda: errors.append(agree_single(counts[0])))
    waiter.start()
    while counts[1].board.read("0/0") is None:
        time.sleep(0.01)
    counts[1].check_peers()  # at its 3rd batch: the peer's 3 are as many, the exchange will come
    counts[1].count()
    with pytest.raises(UnevenBatchesError, match=r"rank 0: 3, rank 1: 4 or more"):
        counts[1].check_peers()
    waiter.join(timeout=30)
    assert isinstance(errors[0], UnevenBatchesError) and "rank 0: 3, rank 1: 4 or more" in str(errors[0])


def agree_single(counts: BatchCounts) -> BaseException | None:
    try:
        counts.agree()
    except BaseException as err:  # noqa: BLE001 (handed to the test)
        return err
    return None


def test_a_rank_that_never_comes_ends_the_wait_after_the_timeout(boards):
    lonely = BatchCounts(0, 2, boards(), timeout_s=0.5)
    lonely.count(2)
    with pytest.raises(UnevenBatchesError, match="waited 0.5 s for rank"):
        lonely.agree()
