"""The micro-batch count (lightning_hybrid.placement.micro_batches): the candidates a batch allows and the one
whose predicted step, (M + S - 1) x the bottleneck of a micro-batch, is shortest."""

from __future__ import annotations

import pytest

from lightning_hybrid.placement import Block, Device, InfeasiblePlacementError, plan
from lightning_hybrid.placement.micro_batches import choose_micro_batches, micro_batch_candidates, predicted_step


@pytest.mark.parametrize(("batch", "stages", "expected"), [
    (8, 2, [2, 4, 8]), (32, 2, [2, 4, 8]), (4, 2, [2, 4]), (64, 4, [4, 8, 16]), (6, 4, [6]), (13, 2, [13]),
    (1, 2, [1]), (3, 4, [3]), (12, 1, [1, 2, 3, 4]),
])
def test_candidates_are_the_batchs_divisors_from_the_stages_to_four_times_them(batch, stages, expected):
    assert micro_batch_candidates(batch, stages) == expected


def per_sample_cost_plan(seconds_a_sample: dict[int, float], batch: int = 8):
    """plan_for(M): two equal stages of a model whose sample costs seconds_a_sample[micro-batch size]."""
    def plan_for(m: int):
        size = batch // m
        blocks = [Block(f"b{i}", cost=seconds_a_sample[size] * size / 2) for i in range(2)]
        return plan(blocks, [Device("a"), Device("b")], method="exact")
    return plan_for


def test_the_count_whose_step_is_predicted_shortest_is_chosen():
    # CPU-like: a sample costs more in a smaller micro-batch
    cpu = per_sample_cost_plan({1: 0.250, 2: 0.135, 4: 0.083, 8: 0.070})
    chosen = choose_micro_batches(cpu, [2, 4, 8])
    steps = chosen.notes["predicted_step_s"]
    assert steps == pytest.approx({2: 3 * 0.083 * 2, 4: 5 * 0.135, 8: 9 * 0.250 / 2})
    assert chosen.notes["micro_batches"] == 2
    # a sample that costs the same in any micro-batch (FLOPs): only the bubble counts, the most micro-batches win
    flat = choose_micro_batches(per_sample_cost_plan({1: 0.2, 2: 0.2, 4: 0.2, 8: 0.2}), [2, 4, 8])
    assert flat.notes["micro_batches"] == 8
    assert predicted_step(flat, 8) == pytest.approx(9 * 0.1)


def test_counts_nothing_fits_are_left_out_and_if_none_fits_the_error_is_raised():
    def plan_for(m: int):
        if m < 4:
            raise InfeasiblePlacementError(f"{m} micro-batches do not fit")
        return per_sample_cost_plan({1: 0.25, 2: 0.135, 4: 0.083, 8: 0.07})(m)
    chosen = choose_micro_batches(plan_for, [2, 4, 8])
    assert sorted(chosen.notes["predicted_step_s"]) == [4, 8]
    with pytest.raises(InfeasiblePlacementError, match="2 micro-batches do not fit"):
        choose_micro_batches(plan_for, [2])


def test_counts_predicted_within_five_percent_of_the_shortest_go_to_the_fewest_micro_batches():
    # 4 micro-batches predicted 3 % shorter than 2 (the prediction leaves out each micro-batch's messages): 2
    almost = per_sample_cost_plan({1: 1.0, 2: 3 * 0.083 * 2 * 0.97 / 5, 4: 0.083})
    chosen = choose_micro_batches(almost, [2, 4, 8])
    steps = chosen.notes["predicted_step_s"]
    assert steps[4] < steps[2] <= steps[4] * 1.05
    assert chosen.notes["micro_batches"] == 2
    # 7 % shorter is a prediction to follow
    clear = choose_micro_batches(per_sample_cost_plan({1: 1.0, 2: 3 * 0.083 * 2 * 0.93 / 5, 4: 0.083}), [2, 4, 8])
    assert clear.notes["micro_batches"] == 4


def test_plan_pipeline_chooses_among_the_batch_s_counts_and_budgets_cap_each_device():
    import torch
    from torch import nn

    from lightning_hybrid.placement.pipeline_stages import plan_pipeline, within_budgets

    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(4)])
    devices = [Device("a", speed=1e9, memory=2**30), Device("b", speed=1e9, memory=2**30)]
    placement = plan_pipeline(blocks, torch.zeros(8, 16, device="meta"), devices, "exact", 2, "bottleneck", 0,
                              {"block_cost": "flops"}, 2, "1F1B", None)
    assert set(placement.notes["predicted_step_s"]) == {2, 4, 8}
    assert placement.notes["micro_batches"] == 8  # FLOPs: only the bubble counts
    fixed = plan_pipeline(blocks, torch.zeros(8, 16, device="meta"), devices, "exact", 2, "bottleneck", 0,
                          {"block_cost": "flops"}, 2, "GPipe", 4)
    assert fixed.notes["micro_batches"] == 4
    assert [d.memory for d in within_budgets(devices, [2**20, 2**31])] == [2**20, 2**30]
    assert [d.memory for d in within_budgets(devices, 2**20)] == [2**20, 2**20]
    with pytest.raises(ValueError, match="gives 1 sizes for 2 pipeline positions"):
        within_budgets(devices, [2**20])
