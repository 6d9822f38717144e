"""Which of compute, latency or bandwidth bounds a data-parallel step (lightning_hybrid.comm.regime): the
thresholds the straggler report and the pages give advice by."""

from __future__ import annotations

import pytest

from lightning_hybrid.comm.regime import (MAX_DELAY, WORTH, classify, lanes, restarts_slow_start_after_idle,
                                          round_trips, sent_bytes)

KB250 = 250e3


def test_a_fast_link_leaves_a_step_compute_bound():
    regime = classify(0.02, 0.0001, KB250, 1e9)  # a LAN: 0.1 ms round trip, 1 GB/s
    assert regime.name == "compute-bound" and regime.overlap_bound < WORTH
    assert regime.advice.startswith("strategy=ddp")


def test_the_compute_bound_threshold_is_the_links_share_of_a_step():
    # the link adds exactly WORTH - 1 of the compute: still compute-bound; a little more: not
    link_s = (WORTH - 1) * 0.02
    assert classify(0.02, link_s / 2, 0.0, 1e9).name == "compute-bound"
    assert classify(0.02, link_s / 2 * 1.01, 0.0, 1e9).name == "latency-bound"


def test_a_long_link_is_latency_bound_and_the_delay_covers_an_exchange():
    # the delay line at 50 ms: 10 ms of compute, the all-reduce's 2 round trips and 51 ms of its bytes
    regime = classify(0.0095, 0.0505, 246824, 4.81e6)
    assert regime.name == "latency-bound" and regime.latency_s == pytest.approx(0.101)
    exchange = 0.101 + 246824 / 4.81e6
    assert f"strategy=delayed_averaging strategy.delay={MAX_DELAY}" in regime.advice  # 16 steps would cover it: capped
    assert regime.overlap_bound == pytest.approx((0.0095 + exchange) / (exchange / MAX_DELAY))
    # a step of compute as long as the exchange: a delay of 1 covers it, and the bound is compute's
    assert "strategy.delay=1" in classify(0.2, 0.05, KB250, 1e9).advice
    assert "strategy.delay=3" in classify(0.04, 0.05, KB250, 1e9).advice  # 100.25 ms over 40 ms steps


def test_on_a_long_link_a_host_that_restarts_tcp_s_slow_start_after_idle_is_told_to_stop_it(tmp_path):
    latency_bound = dict(compute_s=0.0095, round_trip_s=0.0505, step_bytes=246824, bytes_per_s=4.81e6)
    told = classify(**latency_bound, idle_restart=True).advice
    assert "net.ipv4.tcp_slow_start_after_idle=0" in told
    assert told.startswith(classify(**latency_bound).advice) and "tcp_slow" not in classify(**latency_bound).advice
    lan = classify(0.02, 0.0001, KB250, 1e9, idle_restart=True)
    slow = classify(0.02, 0.0002, KB250, 1.25e6, idle_restart=True)
    for other in (lan, slow):  # compute- and bandwidth-bound: not told
        assert other.name != "latency-bound" and "tcp_slow" not in other.advice
    setting = tmp_path / "tcp_slow_start_after_idle"
    for written, read in (("1\n", True), ("0\n", False)):
        setting.write_text(written)
        assert restarts_slow_start_after_idle(str(setting)) is read
    assert restarts_slow_start_after_idle(str(tmp_path / "absent")) is None


def test_a_slow_link_is_bandwidth_bound_and_local_sgd_sends_less():
    regime = classify(0.02, 0.0002, KB250, 1.25e6)  # 10 Mbit/s: 200 ms for a step's bytes
    assert regime.name == "bandwidth-bound"
    assert "strategy=local_sgd strategy.sync_every=10" in regime.advice
    assert regime.overlap_bound == pytest.approx((0.02 + 0.0004 + 0.2) / 0.2)  # the exchanges share the rate


def test_a_step_of_no_compute_is_refused():
    with pytest.raises(ValueError, match="positive"):
        classify(0.0, 0.05, KB250, 1e6)


def test_bytes_round_trips_and_lanes():
    assert sent_bytes("all_reduce", 2, 1000) == 1000 and sent_bytes("all_reduce", 4, 1000) == 1500
    assert sent_bytes("broadcast", 2, 1000) == 1000 and sent_bytes("all_reduce", 1, 1000) == 0
    assert round_trips("all_reduce", 2, 61706) == 2
    assert [lanes(d, "gloo") for d in (0, 1, 2, 3, 4, 8)] == [1, 1, 1, 2, 2, 4]
    assert [lanes(d, "nccl") for d in (1, 2, 4)] == [1, 2, 4]
