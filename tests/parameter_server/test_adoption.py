"""Which surviving worker computes a lost worker's data share (cNeural, on_worker_failure='continue')."""

from __future__ import annotations

import pytest

from lightning_hybrid.parameter_server.adoption import adopted_shares, adopter, shares_of


def test_the_next_live_worker_adopts_wrapping_around():
    assert adopter(1, {0, 2, 3}, 4) == 2
    assert adopter(3, {0, 1, 2}, 4) == 0
    assert adopter(1, {0, 3}, 4) == 3  # 2 is lost too: the next live one


def test_every_share_is_covered_exactly_once_whatever_is_lost():
    for lost in ({1}, {0}, {1, 2}, {3, 0}, {1, 2, 3}):
        live = set(range(4)) - lost
        covered = [r for w in sorted(live) for r in shares_of(w, live, 4)]
        assert sorted(covered) == [0, 1, 2, 3], lost


def test_a_lost_adopter_passes_on_what_it_adopted():
    assert shares_of(2, {0, 2, 3}, 4) == [2, 1]
    assert adopted_shares(3, {0, 3}, 4) == [1, 2]  # 2 (which had adopted 1) is lost as well


def test_no_live_worker_left_is_an_error():
    with pytest.raises(ValueError, match="no live worker"):
        adopter(0, set(), 2)
