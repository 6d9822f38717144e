"""The parameter server's load report (plain Python: no processes)."""

from __future__ import annotations

import time

import pytest

from lightning_hybrid.parameter_server.load import LoadMeter, ServerLoad
from lightning_hybrid.parameter_server.protocol import Bye, decode, encode


def test_load_figures():
    load = ServerLoad(pushes=400, steps=100, wall_s=8.0, busy_s=2.0, cpu_s=0.4)
    assert load.busy_fraction == 0.25
    assert load.cpu_ms_per_push == pytest.approx(1.0)
    assert load.workers_to_saturate(worker_s_per_push=0.012) == pytest.approx(12.0)
    metrics = load.as_metrics()
    assert metrics["server/pushes"] == 400.0 and metrics["server/cpu_ms_per_push"] == pytest.approx(1.0)
    assert "400 pushes, 100 steps" in load.describe() and "25.0 %" in load.describe()
    idle = ServerLoad(0, 0, 0.0, 0.0, 0.0)
    assert idle.busy_fraction == 0.0 and idle.cpu_ms_per_push == 0.0 and idle.workers_to_saturate(0.01) == float("inf")


def test_meter_starts_at_the_first_step_and_counts_handling_time():
    meter = LoadMeter()
    with meter.handling():
        meter.pushed()
        time.sleep(0.05)  # before the first step: start-up, not measured
    assert meter.report() == ServerLoad(0, 0, 0.0, 0.0, 0.0)
    with meter.handling():
        meter.pushed()
        meter.stepped()  # the first step ends here: measuring starts
    for _ in range(3):
        with meter.handling():
            meter.pushed()
            time.sleep(0.02)
            meter.stepped()
    time.sleep(0.03)  # waiting for requests: not busy
    load = meter.report()
    assert (load.pushes, load.steps) == (3, 3)
    assert 0.06 <= load.busy_s < 0.06 + 0.04
    assert load.wall_s >= load.busy_s + 0.03


def test_bye_carries_the_load_in_microseconds():
    load = ServerLoad(pushes=12, steps=3, wall_s=1.5, busy_s=0.25, cpu_s=0.125)
    message, nbytes, inline = decode(encode(Bye.of(load)))
    assert isinstance(message, Bye) and message.load == load and nbytes == 0
