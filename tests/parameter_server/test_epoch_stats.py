"""A parameter-server worker's figures of an epoch (lightning_hybrid.parameter_server.epoch_stats), without a
Trainer: the all-gather is a stand-in."""

from __future__ import annotations

import pytest
import torch

from lightning_hybrid.parameter_server import epoch_stats
from lightning_hybrid.parameter_server.epoch_stats import (
    WorkerEpochStats, epoch_history, epoch_logs, from_row, gather_stats, new_counts, summarise, to_row,
)


def test_a_new_tally_is_zero_and_summarises_to_zeros():
    counts = new_counts()
    assert counts == dict(iterations=0, samples=0, staleness_sum=0, staleness_max=0, wait_s=0.0, max_gap=0)
    assert summarise(counts) == WorkerEpochStats()  # no iteration, no training time: no division by zero
    counts["samples"] += 1
    assert new_counts()["samples"] == 0  # a fresh dict each time


def test_summarise_takes_means_and_rates():
    counts = new_counts() | dict(iterations=4, samples=40, staleness_sum=6, staleness_max=3, wait_s=1.5, max_gap=2,
                                 train_s=2.0)
    stats = summarise(counts)
    assert stats == WorkerEpochStats(iterations=4, samples=40, staleness_mean=1.5, staleness_max=3, wait_s=1.5,
                                     train_s=2.0, max_gap=2, samples_per_s=20.0)
    assert isinstance(stats.iterations, int) and isinstance(stats.staleness_max, int)


def test_a_row_of_floats_round_trips_with_the_integer_fields_as_ints():
    stats = WorkerEpochStats(iterations=3, samples=12, staleness_mean=0.5, staleness_max=2, wait_s=0.25, train_s=1.0,
                             max_gap=1, samples_per_s=12.0)
    row = to_row(stats)
    assert row.dtype == torch.float64 and row.tolist() == [3, 12, 0.5, 2, 0.25, 1.0, 1, 12.0]
    back = from_row(row)
    assert back == stats and type(back.samples) is int and type(back.wait_s) is float


def test_gather_stats_keys_each_members_figures_by_its_original_rank(monkeypatch):
    rows = [to_row(WorkerEpochStats(iterations=5)), to_row(WorkerEpochStats(iterations=7, max_gap=3))]
    sent = []
    monkeypatch.setattr(epoch_stats, "all_gather", lambda row: sent.append(row) or rows)
    gathered = gather_stats(WorkerEpochStats(iterations=5), members=[0, 2])  # worker 1 was lost
    assert gathered == {0: WorkerEpochStats(iterations=5), 2: WorkerEpochStats(iterations=7, max_gap=3)}
    assert torch.equal(sent[0], rows[0])
    history = epoch_history(gathered, 3)
    assert history == [gathered[0], WorkerEpochStats(), gathered[2]]  # zeros for the lost worker


@pytest.mark.parametrize("names, with_gap", [(("iterations", "max_gap"), True), (("iterations",), False)])
def test_epoch_logs_name_each_gathered_workers_figures(names, with_gap):
    gathered = {0: WorkerEpochStats(iterations=5, max_gap=1), 2: WorkerEpochStats(iterations=7, max_gap=4)}
    logs = epoch_logs(gathered, 3, names, "ssp")
    expected = {f"ssp/worker{rank}/{name}": float(getattr(gathered[rank], name)) for rank in (0, 2) for name in names}
    if with_gap:
        expected["ssp/max_gap"] = 4.0
    assert logs == expected
    assert all(isinstance(v, float) for v in logs.values())
