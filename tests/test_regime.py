"""Which of compute, latency or bandwidth bounds a data-parallel step (lightning_hybrid.comm.regime): the
thresholds the straggler report and the pages give advice by."""

from __future__ import annotations

import pytest

from lightning_hybrid.comm.regime import WORTH, classify, round_trips, sent_bytes

KB250 = 250e3


def test_a_fast_link_leaves_a_step_compute_bound():
    regime = classify(0.02, 0.0001, KB250, 1e9)  # a LAN: 0.1 ms round trip, 1 GB/s
    assert regime.name == "compute-bound" and regime.overlap_bound < WORTH
    assert regime.advice.startswith("strategy=ddp")


def test_the_compute_bound_threshold_is_the_links_share_of_a_step():
    # the link adds exactly WORTH - 1 of the compute: still compute-bound; a little more: not
    link_s = (WORTH - 1) * 0.02
    at = classify(0.02, link_s / 3, 0.0, 1e9)
    above = classify(0.02, link_s / 3 * 1.01, 0.0, 1e9)
    assert at.name == "compute-bound" and above.name == "latency-bound"


def test_a_long_link_is_latency_bound_and_two_steps_cover_an_exchange():
    regime = classify(0.02, 0.05, KB250, 22e6)  # 50 ms round trip, the line's bulk rate
    assert regime.name == "latency-bound"
    assert "strategy=allreduce_asgd strategy.delay=2" in regime.advice
    # DDP's step: 20 ms + 3 round trips + 11 ms of bytes; the overlapped step no shorter than half an exchange
    floor = (2 * 0.05 + KB250 / 22e6) / 2
    assert regime.overlap_bound == pytest.approx((0.02 + 0.15 + KB250 / 22e6) / floor)
    assert regime.latency_s == pytest.approx(0.15)


def test_two_exchanges_at_once_bound_the_delay_that_helps():
    # 200 ms round trips: the step is bounded by the exchange over gloo's two slots, so delay 2 is enough
    regime = classify(0.02, 0.2, KB250, 22e6)
    assert "strategy.delay=2" in regime.advice
    # with NCCL's one slot at a time the step is the whole exchange: delay 1 covers it
    assert "strategy.delay=1" in classify(0.02, 0.2, KB250, 22e6, in_flight=1).advice
    # a short round trip against a long step: one step of compute covers it
    assert "strategy.delay=1" in classify(0.2, 0.05, KB250, 1e9).advice


def test_a_slow_link_is_bandwidth_bound_and_local_sgd_sends_less():
    regime = classify(0.02, 0.0002, KB250, 1.25e6)  # 10 Mbit/s: 200 ms for a step's bytes
    assert regime.name == "bandwidth-bound"
    assert "strategy=local_sgd strategy.sync_every=10" in regime.advice
    assert regime.overlap_bound == pytest.approx((0.02 + 0.0006 + 0.2) / 0.2)


def test_a_step_of_no_compute_is_refused():
    with pytest.raises(ValueError, match="positive"):
        classify(0.0, 0.05, KB250, 1e6)


def test_bytes_and_round_trips_of_a_ring():
    assert sent_bytes("all_reduce", 2, 1000) == 1000 and sent_bytes("all_reduce", 4, 1000) == 1500
    assert sent_bytes("broadcast", 2, 1000) == 1000 and sent_bytes("all_reduce", 1, 1000) == 0
    assert round_trips("all_reduce", 2, 61706) == 2
