"""Placement algorithms (no Lightning, no processes): GABRA against the exact optimum, the baselines,
paper 003's knapsack objective on a hand-checked instance, bad input, and the block cost model."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from lightning_hybrid.devices import parse_size
from lightning_hybrid.models import LeNet5, ResAttNet3D
from lightning_hybrid.placement import (
    GABRA, METHODS, Block, Device, InfeasiblePlacementError, Problem, devices_from_config, plan, profile_blocks,
)
from lightning_hybrid.pipeline.materialize import meta_copy
from lightning_hybrid.placement.problem import stage_bytes


def random_instance(rng: np.random.Generator) -> tuple[list[Block], list[Device]]:
    n, m = int(rng.integers(8, 41)), int(rng.integers(2, 9))
    blocks = [
        Block(f"b{i}", cost=float(rng.uniform(1, 10)), out_bytes=float(rng.uniform(0, 5)), memory=float(rng.uniform(1, 10)))
        for i in range(n)
    ]
    total = sum(b.memory for b in blocks)
    devices = [
        Device(f"d{j}", speed=float(rng.uniform(1, 4)), memory=float(rng.uniform(1.0, 3.0) * total / m),
               bandwidth=float(rng.uniform(1, 10)))
        for j in range(m)
    ]
    return blocks, devices


def feasible_instances(count: int, seed: int) -> list[tuple[list[Block], list[Device]]]:
    rng, out, infeasible = np.random.default_rng(seed), [], 0
    while len(out) < count:
        blocks, devices = random_instance(rng)
        try:
            Problem(blocks, devices)
            plan(blocks, devices, method="exact")
        except InfeasiblePlacementError:
            infeasible += 1
            continue
        out.append((blocks, devices))
    return out


def brute_force(blocks: list[Block], devices: list[Device], k: int) -> float:
    try:
        problem = Problem(blocks, devices, k)
    except InfeasiblePlacementError:
        return math.inf
    best = math.inf
    for order in itertools.permutations(range(len(devices)), k):
        for cuts in itertools.combinations(range(1, len(blocks)), k - 1):
            edges = [0, *cuts, len(blocks)]
            p = problem.placement("brute", order, list(zip(edges[:-1], edges[1:])))
            if p.feasible:
                best = min(best, p.bottleneck)
    return best


def test_gabra_within_one_percent_of_exact_on_10_random_instances():
    ratios = []
    for i, (blocks, devices) in enumerate(feasible_instances(10, seed=2026)):
        exact = plan(blocks, devices, method="exact")
        gabra = plan(blocks, devices, method="gabra", seed=i)
        assert gabra.feasible and exact.feasible
        assert sorted(gabra.device_order) == sorted(set(gabra.device_order))
        assert gabra.boundaries[0][0] == 0 and gabra.boundaries[-1][1] == len(blocks)
        ratios.append(gabra.bottleneck / exact.bottleneck)
    assert min(ratios) >= 1 - 1e-9, "GABRA beat the exact solver: the exact solver is wrong"
    assert max(ratios) <= 1.01, ratios


def test_exact_equals_brute_force_and_beats_every_method():
    rng = np.random.default_rng(7)
    for _ in range(15):
        n, m = int(rng.integers(3, 8)), int(rng.integers(2, 4))
        k = int(rng.integers(1, min(n, m) + 1))
        blocks = [Block(f"b{i}", cost=float(rng.uniform(1, 5)), out_bytes=float(rng.uniform(0, 3)),
                        memory=float(rng.uniform(1, 4))) for i in range(n)]
        devices = [Device(f"d{j}", speed=float(rng.uniform(1, 3)), memory=float(rng.uniform(4, 12)),
                          bandwidth=float(rng.uniform(1, 5))) for j in range(m)]
        expected = brute_force(blocks, devices, k)
        if not math.isfinite(expected):
            with pytest.raises(InfeasiblePlacementError):
                plan(blocks, devices, method="exact", stages=k)
            continue
        exact = plan(blocks, devices, method="exact", stages=k, memory_headroom=0)  # the fastest, however full
        assert exact.bottleneck == pytest.approx(expected)
        for method in METHODS:
            try:
                other = plan(blocks, devices, method=method, stages=k, t_max=300, memory_headroom=0)
            except InfeasiblePlacementError:
                continue
            assert other.bottleneck >= exact.bottleneck - 1e-9, method


def test_stage_time_is_compute_plus_transfer_except_last():
    blocks = [Block("a", cost=6, out_bytes=100), Block("b", cost=3, out_bytes=50), Block("c", cost=3, out_bytes=10)]
    devices = [Device("x", speed=2, bandwidth=25), Device("y", speed=3, bandwidth=10)]
    p = Problem(blocks, devices).placement("manual", [0, 1], [(0, 1), (1, 3)])
    assert [s.compute_s for s in p.stages] == [3.0, 2.0]
    assert [s.transfer_s for s in p.stages] == [4.0, 0.0]
    assert p.bottleneck == 7.0


def test_heuristics_ignore_speeds_and_gabra_does_not():
    blocks = [Block(f"b{i}", cost=1.0, params=10) for i in range(12)]
    devices = [Device("slow", speed=1.0), Device("fast", speed=2.0)]
    assert plan(blocks, devices, method="uniform").boundaries == [(0, 6), (6, 12)]
    assert plan(blocks, devices, method="parameters").boundaries == [(0, 6), (6, 12)]
    assert plan(blocks, devices, method="time").boundaries == [(0, 6), (6, 12)]
    gabra = plan(blocks, devices, method="gabra")
    assert gabra.bottleneck == pytest.approx(4.0)  # 4 blocks on the slow device, 8 on the fast one
    assert plan(blocks, devices, method="uniform").bottleneck == pytest.approx(6.0)


def test_time_method_balances_measured_time():
    blocks = [Block(f"b{i}", cost=1.0, time=t) for i, t in enumerate([3.0, 1.0, 1.0, 1.0])]
    assert plan(blocks, [Device(), Device()], method="time").boundaries == [(0, 1), (1, 4)]


def test_gabra_is_reproducible_with_a_seed():
    blocks, devices = feasible_instances(1, seed=3)[0]
    a = plan(blocks, devices, method="gabra", seed=5, t_max=200)
    b = plan(blocks, devices, method="gabra", seed=5, t_max=200)
    assert a.boundaries == b.boundaries and a.device_order == b.device_order


# ---------------------------------------------------------------------- paper 003's objective
PAPER_BLOCKS = [Block(f"p{i}", cost=c) for i, c in enumerate([1.0, 2.0, 3.0, 2.0])]
PAPER_DEVICES = [Device("d0", speed=1.0), Device("d1", speed=3.0)]


def test_paper_objective_matches_hand_computed_knapsack_profits():
    # horizon = 1.25 * 8 / 4 = 2.5 s, capacities d0 = 2.5, d1 = 7.5 (compute units)
    ga = GABRA(Problem(PAPER_BLOCKS, PAPER_DEVICES), objective="paper")
    assert ga.horizon == pytest.approx(2.5)
    assert ga.fitness_of([0, 1], [(0, 1), (1, 4)]) == pytest.approx(1 / 2.5 + 7 / 7.5)
    assert ga.fitness_of([1, 0], [(0, 3), (3, 4)]) == pytest.approx(6 / 7.5 + 2 / 2.5)
    assert ga.fitness_of([0, 1], [(0, 2), (2, 4)]) == 0.0  # load 3 > capacity 2.5 of d0 (eq. 6)
    assert ga.fitness_of([1, 0], [(0, 1), (1, 4)]) == 0.0  # load 7 > 2.5


def test_paper_objective_ga_finds_the_hand_checked_optimum():
    # feasible placements: ([0,1], cut 1) profit 1.3333 and ([1,0], cut 3) profit 1.6: the optimum
    best = plan(PAPER_BLOCKS, PAPER_DEVICES, method="gabra", objective="paper", seed=0, t_max=200)
    assert best.objective == "paper"
    assert best.device_order == [1, 0] and best.boundaries == [(0, 3), (3, 4)]
    assert best.fitness == pytest.approx(1.6)


def test_ga_operators_follow_algorithms_1_to_3():
    ga = GABRA(Problem(PAPER_BLOCKS, PAPER_DEVICES), seed=0)
    a, b = np.array([0, 0, 1, 1]), np.array([1, 0, 0, 0])
    c1, c2 = ga.crossover(a, b)  # Algorithm 3: mid-point
    assert c1.tolist() == [0, 0, 0, 0] and c2.tolist() == [1, 0, 1, 1]
    genes = np.arange(10)
    mutated = ga.mutate(genes)
    changed = np.nonzero(mutated != genes)[0]
    assert sorted(mutated) == list(genes)
    if len(changed):
        segment = slice(changed[0], changed[-1] + 1)
        assert mutated[segment].tolist() == genes[segment][::-1].tolist()  # inversion
    fitness = np.array([1.0, 3.0, 0.0, 6.0])
    draws = np.bincount([ga.select(fitness) for _ in range(20000)], minlength=4) / 20000
    assert draws == pytest.approx(fitness / fitness.sum(), abs=0.02)  # roulette wheel
    order, bounds = ga.decode(np.array([1, 0, 1, 1]))  # repaired: d1 first (first gene), 3 blocks
    assert order == [1, 0] and bounds == [(0, 3), (3, 4)]


# ---------------------------------------------------------------------- bad input
def test_more_stages_than_blocks_is_refused():
    with pytest.raises(InfeasiblePlacementError, match="only 2 blocks"):
        plan([Block("a", 1), Block("b", 1)], [Device(), Device(), Device()])


def test_capacities_that_cannot_hold_the_model_are_refused():
    blocks = [Block("a", 1, memory=6 * 2**20), Block("b", 1, memory=6 * 2**20)]
    with pytest.raises(InfeasiblePlacementError, match="needs 12.0 MiB but the 2 largest devices hold 10.0 MiB"):
        plan(blocks, [Device(memory=5 * 2**20), Device(memory=5 * 2**20)])
    blocks = [Block("a", 1, memory=6 * 2**20), Block("b", 1, memory=1 * 2**20)]
    with pytest.raises(InfeasiblePlacementError, match="block 'a' needs 6.0 MiB"):
        plan(blocks, [Device(memory=4 * 2**20), Device(memory=5 * 2**20)])
    tight = [Block("a", 1, memory=5), Block("b", 1, memory=5), Block("c", 1, memory=5)]
    with pytest.raises(InfeasiblePlacementError, match="no placement"):  # 10 + 5 > 9 however it is cut
        plan(tight, [Device(memory=9), Device(memory=9)], method="exact")
    with pytest.raises(InfeasiblePlacementError, match="no placement"):
        plan(tight, [Device(memory=9), Device(memory=9)], method="gabra", t_max=50)
    with pytest.raises(InfeasiblePlacementError, match="'uniform' placement does not fit"):
        plan(tight, [Device(memory=6), Device(memory=12)], method="uniform")


def test_bad_device_descriptions_are_refused():
    with pytest.raises(ValueError, match="speed must be"):
        Device(speed=0)
    with pytest.raises(ValueError, match="unknown keys"):
        devices_from_config([{"speed": 1, "sped": 2}])
    with pytest.raises(ValueError, match="cannot read a size"):
        parse_size("12 parsecs")
    assert parse_size("16GiB") == 16 * 2**30 and parse_size("10GB/s") == 1e10 and parse_size("inf") == math.inf
    devices = devices_from_config([1, {"name": "gpu", "speed": 2, "memory": "1MiB", "bandwidth": 1e9}])
    assert devices[1] == Device("gpu", 2.0, 2**20, 1e9) and devices[0].name == "device0"
    with pytest.raises(ValueError, match="unknown placement method"):
        plan([Block("a", 1)], [Device()], method="random")


# ---------------------------------------------------------------------- cost model
def test_profile_blocks_counts_flops_bytes_and_memory_of_lenet5():
    net = LeNet5()
    x = torch.randn(4, 1, 28, 28)
    blocks = profile_blocks(net, x)
    assert [b.name for b in blocks] == ["c1", "s2", "c3", "s4", "c5", "f6", "output"]
    assert blocks[0].out_bytes == 4 * 6 * 28 * 28 * 4
    assert blocks[-1].out_bytes == 4 * 10 * 4
    # forward FLOPs of c1: 2 * out elements * in_ch * k * k; backward for weights doubles it (no input grad)
    assert blocks[0].cost == 2 * (2 * 4 * 6 * 28 * 28 * 25)
    assert blocks[1].cost == 0 and blocks[1].params == 0
    assert blocks[-1].params == 84 * 10 + 10
    assert blocks[-1].memory >= (84 * 10 + 10) * 4 * 3  # weights, gradients, one optimizer slot
    assert all(p.grad is None for p in net.parameters())


class _Square(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x  # autograd saves x twice: one storage


def test_a_tensor_saved_twice_counts_once_and_a_stage_counts_a_shared_boundary_once():
    """Held activations are storages: ``x * x`` saves its input twice, a ReLU's result is saved by it and by
    the next block's Linear; the blocks' sum counted them twice (a stage's estimate 1.3x its measured peak)."""
    net = torch.nn.Sequential(torch.nn.Linear(256, 256), _Square(),
                              torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU()),
                              torch.nn.Linear(256, 256))
    x = torch.randn(8, 256)
    one = 8 * 256 * 4  # bytes of one activation of the batch
    for model, example in ((net, x), (meta_copy(net), x.to("meta"))):  # real tensors, and shapes only
        linear, square, relu_block, last = profile_blocks(model, example, optimizer_slots=0)
        params = 256 * 256 * 4 + 256 * 4
        assert linear.memory == 2 * params + one and linear.shared_with_previous == 0  # its input
        assert square.memory == one and square.shared_with_previous == 0  # x once; Linear saved no output
        # ReLU saves its result, which the Linear after it saves as input: one storage; ReLU's output saved by the last
        assert relu_block.memory == 2 * params + 2 * one and relu_block.shared_with_previous == 0
        assert last.memory == 2 * params + one and last.shared_with_previous == one
        assert stage_bytes([relu_block, last]) == 2 * params + 2 * one + 2 * params + max(b.workspace for b in (relu_block, last))
        problem = Problem([linear, square, relu_block, last], [Device("d", speed=1.0, memory=1e9)] * 2, stages=2)
        assert problem.stage_memory[2, 4] == pytest.approx(stage_bytes([relu_block, last]))
        assert problem.stage_memory[3, 4] == pytest.approx(stage_bytes([last]))  # the first of its stage holds it whole
        assert problem.stage_memory[0, 4] == pytest.approx(stage_bytes([linear, square, relu_block, last]))
        # a pipeline keeps 3 micro-batches' messages a step: at the cut after block 1, its output sent on and its
        # input gradient sent back
        messages = Problem([linear, square, relu_block, last], [Device("d", speed=1.0, memory=1e9)] * 2, 2, held_messages=3)
        assert messages.stage_memory[0, 2] == pytest.approx(stage_bytes([linear, square]) + 3 * square.out_bytes)
        assert messages.stage_memory[2, 4] == pytest.approx(stage_bytes([relu_block, last]) + 3 * square.out_bytes)
        assert messages.stage_memory[0, 4] == pytest.approx(problem.stage_memory[0, 4])  # one stage: no messages
    # with every block checkpointed a block keeps its input only: nothing is shared with the block before
    assert all(b.shared_with_previous == 0 for b in profile_blocks(net, x, checkpointed=True))


def test_profile_blocks_leaves_batchnorm_statistics_alone_and_measures_time():
    net = ResAttNet3D(depth=18, base_channels=4)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    blocks = profile_blocks(net, torch.randn(2, 1, 32, 32, 32), measure_time=True, repeats=1)
    assert len(blocks) == len(list(net.children()))
    assert all(b.time is not None and b.time > 0 for b in blocks)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    with pytest.raises(TypeError, match="not an nn.Sequential"):
        profile_blocks(torch.nn.Linear(2, 2), torch.zeros(1, 2))


def test_patience_ends_a_stalled_search_early():
    blocks, devices = feasible_instances(1, seed=11)[0]
    full = plan(blocks, devices, method="gabra", seed=0, t_max=3000)
    early = plan(blocks, devices, method="gabra", seed=0, t_max=3000, patience=50)
    assert full.generations == 3000  # no provable optimum on this instance: the full search runs to t_max
    assert early.generations < 3000
    assert early.bottleneck >= full.bottleneck - 1e-12
    with pytest.raises(ValueError, match="patience"):
        plan(blocks, devices, method="gabra", patience=0)
