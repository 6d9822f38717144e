"""The straggler report: the split of each rank's cycle into own work and wait (plain Python), and
real 2-process DDP runs with a persistent 4x straggler in a callback or in data loading, one with
spells, and one without (no false alarm)."""

from __future__ import annotations

import json

import pytest

from conftest import run_train_script
from lightning_hybrid.straggler_analysis import ADVICE, RankTimes, analyse


def ranks_in_step(own: list[list[float]], sync: float = 0.01, samples: int = 16) -> list[RankTimes]:
    """Ranks that meet at every step's all-reduce: each waits there for the slowest rank's own work."""
    batches = len(own[0])
    slowest = [max(o[i] for o in own) for i in range(batches)]
    return [RankTimes(cycle=[slowest[i] + sync for i in range(batches)],
                      sync=[sync + slowest[i] - o[i] for i in range(batches)],
                      check=[0.0] * batches, samples=[samples] * batches) for o in own]


def test_a_persistent_straggler_is_named_with_its_factor_and_the_others_wait_for_it():
    finding = analyse(ranks_in_step([[0.1] * 20, [0.1] * 20, [0.4] * 20]))
    assert (finding.slow_rank, finding.pattern) == (2, "persistent")
    assert finding.factor == pytest.approx(0.41 / 0.11, rel=0.02)  # own work includes the step's own sync time
    assert finding.wait_s[0] == pytest.approx(0.3, abs=0.01) and finding.wait_s[2] == pytest.approx(0.0, abs=0.01)
    assert "rank 2 is 3.7x slower" in finding.line(3) and ADVICE["persistent"] in finding.line(3)


def test_spells_are_transient_and_equal_ranks_raise_nothing():
    spells = [0.1] * 30
    for i in (3, 14, 25):
        spells[i] = 0.9
    finding = analyse(ranks_in_step([[0.1] * 30, spells]))
    assert (finding.slow_rank, finding.pattern) == (1, "transient")
    calm = analyse(ranks_in_step([[0.1 + 0.003 * (i % 3) for i in range(30)], [0.1 + 0.003 * (i % 2) for i in range(30)]]))
    assert calm.pattern == "none" and calm.slow_rank is None and "no rank is slower" in calm.line(0)


def test_shares_of_different_sizes_are_compared_per_sample():
    """Balanced data parallelism gives the slow rank fewer samples: its own work per sample is what is slow."""
    ranks = [RankTimes([0.2] * 10, [0.01] * 10, [0.0] * 10, [26] * 10), RankTimes([0.2] * 10, [0.01] * 10, [0.0] * 10, [6] * 10)]
    finding = analyse(ranks)
    assert finding.slow_rank == 1 and finding.factor == pytest.approx(26 / 6, rel=0.05)


#: 0.1 s of compute per step on every rank; the slow rank loses 3 x that more (a 4x straggler).
COMPUTE_S, SAMPLES, BATCH = 0.1, 256, 16


@pytest.mark.multiprocess
@pytest.mark.parametrize("source", ["callback", "data", "spells", "none", "latency"])
def test_the_report_names_the_slow_rank_under_ddp(tmp_path, source):
    extra = [] if source in ("none", "latency") else ["--slow-rank", "1", "--slow-by", source]
    if source == "latency":  # a long link, simulated: a 50 ms round trip, 3 of them a step
        extra += ["--latency", "0.05"]
    if source in ("callback", "data"):
        extra += ["--slow-per-sample", str(3 * COMPUTE_S / BATCH)]
    if source == "spells":
        extra += ["--slow-per-sample", str(12 * COMPUTE_S / BATCH)]  # a 13x spell after one step in ten
    samples = 512 if source == "spells" else SAMPLES  # spells need batches to show in
    run_train_script(tmp_path, "--strategy", "ddp", "--samples", str(samples), "--batch-size", str(BATCH), "--epochs", "2",
                     "--compute-sleep", str(COMPUTE_S), "--straggler-report", *extra)
    findings = json.loads((tmp_path / "straggler.json").read_text())
    assert len(findings) == 2
    regime = json.loads((tmp_path / "regime.json").read_text())
    if source in ("none", "latency"):
        assert all(f["pattern"] == "none" and f["slow_rank"] is None for f in findings), findings
    if source == "none":  # loopback: the link adds nothing worth hiding
        assert regime["regime"]["name"] == "compute-bound", regime
        assert regime["round_trip_s"] < 0.01, regime
    elif source == "latency":  # the report measured the simulated round trip, and says what hides it
        assert 0.045 <= regime["round_trip_s"] <= 0.07, regime
        assert regime["regime"]["name"] == "latency-bound", regime
        assert regime["regime"]["advice"].startswith("strategy=delayed_averaging strategy.delay="), regime
    elif source == "spells":
        assert all(f["pattern"] != "persistent" for f in findings), findings
        assert any(f["pattern"] == "transient" and f["slow_rank"] == 1 for f in findings), findings
    else:
        for f in findings:
            assert f["slow_rank"] == 1 and f["pattern"] == "persistent", findings
            assert 3.2 <= f["factor"] <= 4.8, f"a 4x straggler reported as {f['factor']:.2f}x"
            assert f["wait_s"][0] > 2 * COMPUTE_S, "rank 0 waits for rank 1"
