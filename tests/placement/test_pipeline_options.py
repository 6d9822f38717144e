"""A placed pipeline's settings checked before processes start (lightning_hybrid.placement.pipeline_options), and
the placement's one-line summary the strategy logs (lightning_hybrid.placement.figure.placement_summary)."""

from __future__ import annotations

import pytest

from lightning_hybrid.devices import Device
from lightning_hybrid.placement import Block, plan
from lightning_hybrid.placement.figure import placement_summary
from lightning_hybrid.placement.pipeline_options import check_pipeline_options, check_stage_sizes

GOOD = dict(pipeline_stages=2, data_parallel=1, placement="gabra", schedule="1F1B", micro_batches=4,
            gradient_sync="sync", delay=1, optimizer_slots=1, devices=None)


def test_good_settings_come_back_with_stage_sizes_as_ints_and_devices_parsed():
    assert check_pipeline_options(**GOOD) == ("gabra", None)
    placement, devices = check_pipeline_options(**GOOD | dict(placement=(2.0, 3), devices=[1.0, {"speed": 2.0}]))
    assert placement == [2, 3] and all(type(size) is int for size in placement)
    assert [d.speed for d in devices] == [1.0, 2.0] and all(isinstance(d, Device) for d in devices)
    check_pipeline_options(**GOOD | dict(schedule="GPipe", micro_batches=1, delay=0, optimizer_slots=0))


@pytest.mark.parametrize("change, message", [
    (dict(pipeline_stages=0), "pipeline_stages must be a positive integer, got 0"),
    (dict(data_parallel=True), "data_parallel must be a positive integer, got True"),
    (dict(micro_batches=2.0), "micro_batches must be a positive integer"),
    (dict(placement="random"), "placement must be one of .* or a list of stage sizes, got 'random'"),
    (dict(placement=[3]), "placement as stage sizes needs 2 positive block counts, got \\[3\\]"),
    (dict(placement=[3, 0]), "needs 2 positive block counts"),
    (dict(schedule="zero-bubble"), "schedule must be one of"),
    (dict(micro_batches=1), "1F1B' needs at least as many micro-batches as stages"),
    (dict(gradient_sync="async"), "gradient_sync must be 'sync' or 'delayed'"),
    (dict(delay=-1), "delay must be a non-negative integer, got -1"),
    (dict(optimizer_slots=None), "optimizer_slots must be a non-negative integer"),
    (dict(devices=[1.0]), "devices describes 1 devices but pipeline_stages=2"),
])
def test_settings_a_pipeline_cannot_run_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        check_pipeline_options(**GOOD | change)


def test_stage_sizes_against_the_models_blocks():
    check_stage_sizes(["a", "b", "c"], 2, "gabra")
    check_stage_sizes(["a", "b", "c"], 2, [1, 2])
    with pytest.raises(ValueError, match=r"pipeline_stages=4 but the model has only 3 blocks \(a, b, c\); use at most 3"):
        check_stage_sizes(["a", "b", "c"], 4, "gabra")
    with pytest.raises(ValueError, match=r"placement stage sizes \[2, 2\] add up to 4 blocks, the model has 3"):
        check_stage_sizes(["a", "b", "c"], 2, [2, 2])


def test_the_placement_summary_names_each_stages_blocks_rank_and_device():
    blocks = [Block(f"b{i}", cost=c) for i, c in enumerate([4, 1, 1, 2, 2, 2])]
    devices = [Device("slow", speed=1.0), Device("fast", speed=2.0)]
    placement = plan(blocks, devices, method="exact")
    names = [f"layer{i}" for i in range(6)]
    line = placement_summary(placement, devices, names, ranks=[1, 0])
    assert line.startswith(f"exact placement, predicted bottleneck {placement.bottleneck:.4g} ")
    for s, stage in enumerate(placement.stages):
        assert (f"stage {s}: layer{stage.start}..layer{stage.stop - 1} on rank {[1, 0][s]} "
                f"({devices[stage.device].name}, {stage.time_s:.4g} s, ") in line
    assert "\n" not in line
