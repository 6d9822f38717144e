"""Sparse FC layer partitions (MoDNN's 1-D baseline and MSCC + FGCP) and the SpMV/GEMV threshold."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from lightning_hybrid.partition import (
    GO,
    LayerCost,
    block_sparse_matrix,
    compute_cost,
    format_cost_table,
    measure_sparsity_threshold,
    mscc_fgcp_partition,
    proportional_sizes,
    random_sparse_matrix,
    rows_partition,
    sparsity_timings,
    spectral_coclusters,
    threshold_from_timings,
)
from lightning_hybrid.partition.sparse import nonzero_coords, to_csr

ABILITIES = {2: [1.0, 3.0], 3: [2.0, 1.0, 1.5], 4: [1.0, 2.0, 3.0, 4.0]}


def plan_with(planner: str, W, abilities, **kwargs):
    if planner == "rows":
        return rows_partition(W, abilities, **kwargs)
    return mscc_fgcp_partition(W, abilities, go_ability=kwargs.pop("go_ability", 50.0), **kwargs)


def linear_nonzeros(plan) -> np.ndarray:
    return np.concatenate([p.rows * plan.shape[1] + p.cols for p in plan.all_parts])


# ----------------------------------------------------------------------------------------------
# apply(): the distributed execution gives W @ x
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("planner", ["rows", "mscc"])
@pytest.mark.parametrize("workers", [2, 3, 4])
@pytest.mark.parametrize("kind", ["block", "random", "dense"])
def test_apply_equals_matmul(planner, workers, kind):
    if kind == "block":
        W = block_sparse_matrix(90, 140, blocks=workers, sparsity=0.85, outlier_fraction=0.15, seed=workers)
    elif kind == "random":
        W = random_sparse_matrix(140, 90, sparsity=0.9, seed=workers)
    else:
        W = np.random.default_rng(workers).standard_normal((50, 70)).astype(np.float32)
    plan = plan_with(planner, W, ABILITIES[workers])
    Wt = torch.as_tensor(W)
    x = torch.randn(W.shape[1], generator=torch.Generator().manual_seed(0))
    X = torch.randn(W.shape[1], 5, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(plan.apply(W, x), Wt @ x, rtol=1e-5, atol=1e-5)
    assert torch.allclose(plan.apply(W, X), Wt @ X, rtol=1e-5, atol=1e-5)
    # float64 inputs: computed in float64, so the only difference is summation order
    x64 = x.double()
    assert torch.allclose(plan.apply(W, x64), Wt.double() @ x64, rtol=0, atol=1e-10)


@pytest.mark.parametrize("threshold", [0.0, 0.842, 1.0])
def test_apply_with_every_input_type_and_both_formats(threshold):
    W = block_sparse_matrix(60, 80, blocks=3, sparsity=0.8, outlier_fraction=0.2, seed=3)
    plan = mscc_fgcp_partition(W, [1.0, 2.0, 1.0], go_ability=100.0, sparsity_threshold=threshold)
    assert plan.go_part.nnz > 0  # the GO's own part is exercised too
    formats = set(plan.formats())
    if threshold == 0.0:
        assert formats <= {"spmv", "none"}
    elif threshold == 1.0:
        assert formats <= {"gemv", "none"}
    X = torch.randn(80, 3, dtype=torch.float64)
    expected = torch.as_tensor(W, dtype=torch.float64) @ X
    Wt = torch.as_tensor(W)
    for weights in (W, Wt, Wt.to_sparse(), Wt.to_sparse_csr(), sp.csr_matrix(W), sp.coo_matrix(W)):
        assert torch.allclose(plan.apply(weights, X), expected, atol=1e-10)


def test_part_weights_are_stored_in_the_part_format():
    W = block_sparse_matrix(60, 90, blocks=2, sparsity=0.7, outlier_fraction=0.1, seed=0)
    plan = mscc_fgcp_partition(W, [1.0, 1.0], go_ability=100.0)
    for worker in (0, 1, GO):
        part = plan.part(worker)
        stored = plan.part_weights(W, worker)
        assert tuple(stored.shape) == (part.out_rows.size, part.in_cols.size)
        assert (stored.layout == torch.sparse_csr) == (part.format(plan.sparsity_threshold) == "spmv")
        dense = stored.to_dense() if stored.layout == torch.sparse_csr else stored
        assert torch.equal(dense, torch.as_tensor(W[np.ix_(part.out_rows, part.in_cols)]) * (dense != 0))


def test_apply_refuses_another_pattern_or_shape():
    W = random_sparse_matrix(30, 40, sparsity=0.8, seed=0)
    plan = rows_partition(W, [1.0, 1.0])
    other = W.copy()
    other[np.nonzero(W)[0][0], np.nonzero(W)[1][0]] = 0.0
    with pytest.raises(ValueError, match="nonzero pattern"):
        plan.apply(other, torch.randn(40))
    with pytest.raises(ValueError, match="shape"):
        plan.apply(W[:, :39], torch.randn(39))
    with pytest.raises(ValueError, match="x must have shape"):
        plan.apply(W, torch.randn(39))


# ----------------------------------------------------------------------------------------------
# Structure: every nonzero exactly once, proportional blocks, one peer
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("planner", ["rows", "mscc"])
@pytest.mark.parametrize("workers", [2, 3, 4])
def test_every_nonzero_is_computed_exactly_once(planner, workers):
    W = block_sparse_matrix(120, 100, blocks=3, sparsity=0.9, outlier_fraction=0.2, seed=7)
    plan = plan_with(planner, W, ABILITIES[workers])
    computed = linear_nonzeros(plan)
    assert computed.size == np.count_nonzero(W) == sum(p.nnz for p in plan.all_parts)
    assert np.unique(computed).size == computed.size
    rows, cols = np.nonzero(W)
    assert np.array_equal(np.sort(computed), np.sort(rows * W.shape[1] + cols))


def test_rows_baseline_blocks_are_contiguous_and_proportional():
    wide = np.ones((30, 100), dtype=np.float32)
    plan = rows_partition(wide, [1, 2, 3, 4])  # 100 columns > 30 rows: columns are cut
    assert [p.in_cols.size for p in plan.parts[:4]] == [10, 20, 30, 40]
    starts = [p.in_cols[0] for p in plan.parts[:4]]
    for p in plan.parts[:4]:
        assert np.array_equal(p.in_cols, np.arange(p.in_cols[0], p.in_cols[-1] + 1))
        assert p.out_rows.size == 30
    assert starts == sorted(starts)
    assert plan.go_part.nnz == 0 and plan.bytes_sent() == [4 * (10 + 30), 4 * (20 + 30), 4 * (30 + 30), 4 * (40 + 30)]
    tall = np.ones((70, 20), dtype=np.float32)
    plan = rows_partition(tall, [2.0, 5.0])
    assert [p.out_rows.size for p in plan.parts[:2]] == [20, 50]
    assert plan.info["along"] == "rows"
    other = rows_partition(tall, [2.0, 5.0], along="shorter")  # the other reading of "along its longer side"
    assert other.info["along"] == "cols" and other.method == "rows/shorter"
    assert [p.in_cols.size for p in other.parts[:2]] == [6, 14]
    assert other.total_bytes() > plan.total_bytes()  # cutting the longer side is the cheaper 1-D cut
    with pytest.raises(ValueError, match="along"):
        rows_partition(tall, [1.0], along="diagonal")


def test_rows_baseline_with_a_go_block():
    wide = np.ones((30, 100), dtype=np.float32)
    plan = rows_partition(wide, [1, 1, 1], go_ability=1.0)
    assert plan.method == "rows+go"
    assert [p.in_cols.size for p in plan.all_parts] == [25, 25, 25, 25]
    assert [p.owner for p in plan.all_parts] == [0, 1, 2, GO] and len(plan.parts) == 3
    assert plan.go_part.nnz == 25 * 30 and plan.peers == ((GO,),) * 3


def test_proportional_sizes():
    assert proportional_sizes(10, [1, 2, 2]) == [2, 4, 4]
    assert proportional_sizes(7, [1, 1, 1]) == [3, 2, 2]
    for n in (5, 17, 1000):
        sizes = proportional_sizes(n, [0.3, 1.7, 2.9, 0.1])
        assert sum(sizes) == n
        assert all(abs(s - n * a / 5.0) < 1 for s, a in zip(sizes, [0.3, 1.7, 2.9, 0.1]))


@pytest.mark.parametrize("planner", ["rows", "mscc"])
def test_each_worker_talks_only_to_the_go(planner):
    W = block_sparse_matrix(200, 300, blocks=4, sparsity=0.9, outlier_fraction=0.1, seed=1)
    plan = plan_with(planner, W, ABILITIES[4])
    assert plan.peers == ((GO,), (GO,), (GO,), (GO,))
    cost = plan.cost("fc")
    assert cost.max_peers == 1 and cost.total_bytes == plan.total_bytes() == sum(plan.bytes_sent())
    assert plan.total_bytes(element_size=2) * 2 == plan.total_bytes()


# ----------------------------------------------------------------------------------------------
# MSCC + FGCP
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("abilities", [[1.0, 1.0, 1.0], [1.0, 2.0, 3.0], [3.0, 1.0, 1.0]])
@pytest.mark.parametrize("seed", [0, 1])
def test_mscc_fgcp_sends_clearly_less_than_rows_on_block_structure(abilities, seed):
    # measured: 42-44% fewer bytes for these abilities and seeds (rows: 7200 B)
    W = block_sparse_matrix(400, 600, blocks=3, sparsity=0.9, outlier_fraction=0.1, seed=seed)
    base = rows_partition(W, abilities)
    plan = mscc_fgcp_partition(W, abilities, seed=seed)
    reduction = plan.cost("fc").reduction_vs(base.cost("fc"))
    assert reduction > 0.35, (base.bytes_sent(), plan.bytes_sent())


def test_coclustering_recovers_clean_blocks():
    W = block_sparse_matrix(90, 120, blocks=3, sparsity=0.75, outlier_fraction=0.0, seed=2)
    rows, cols = nonzero_coords(to_csr(W))
    row_labels, col_labels = spectral_coclusters(rows, cols, W.shape, 3)
    assert np.all(row_labels[rows] == col_labels[cols])  # no outliers: every nonzero inside a co-cluster
    assert sorted(np.bincount(row_labels).tolist()) == [30, 30, 30]
    plan = mscc_fgcp_partition(W, [1.0, 1.0, 1.0])
    assert plan.info["outliers"] == 0 and plan.go_part.nnz == 0
    assert plan.formats()[:3] == ["gemv"] * 3  # density 0.75 in each block


def test_bigger_coclusters_go_to_more_able_workers():
    rng = np.random.default_rng(0)
    W = np.zeros((120, 180), dtype=np.float32)
    for r0, r1, c0, c1 in ((0, 20, 0, 30), (20, 60, 30, 90), (60, 120, 90, 180)):  # small, medium, big
        W[r0:r1, c0:c1] = rng.standard_normal((r1 - r0, c1 - c0)) * (rng.random((r1 - r0, c1 - c0)) < 0.8)
    W = W[rng.permutation(120)][:, rng.permutation(180)]
    plan = mscc_fgcp_partition(W, [1.0, 5.0, 2.0])
    assert plan.info["outliers"] == 0
    assert [(plan.part(i).out_rows.size, plan.part(i).in_cols.size) for i in range(3)] == [(20, 30), (60, 90), (40, 60)]


def test_empty_rows_and_columns_are_left_out_of_the_clustering():
    W = block_sparse_matrix(80, 100, blocks=2, sparsity=0.8, outlier_fraction=0.1, seed=4)
    W[[3, 17, 50], :] = 0.0
    W[:, [0, 99]] = 0.0
    plan = mscc_fgcp_partition(W, [1.0, 2.0])
    assert not any(np.isin([3, 17, 50], p.out_rows).any() for p in plan.all_parts)
    x = torch.randn(100, dtype=torch.float64)
    assert torch.allclose(plan.apply(W, x), torch.as_tensor(W, dtype=torch.float64) @ x, atol=1e-10)


def test_fgcp_never_raises_the_makespan_and_uses_a_fast_go():
    W = block_sparse_matrix(400, 600, blocks=3, sparsity=0.9, outlier_fraction=0.1, seed=0)
    abilities = [1.0, 2.0, 3.0]
    for go_ability in (1e-6, 1e-4, 1e-2, 1.0, 100.0):
        before = mscc_fgcp_partition(W, abilities, go_ability=go_ability, fgcp=False)
        after = mscc_fgcp_partition(W, abilities, go_ability=go_ability)
        makespan_before = max(max(before.estimated_s()), before.go_compute_s())
        makespan_after = max(max(after.estimated_s()), after.go_compute_s())
        assert makespan_after <= makespan_before * (1 + 1e-9)
        # FGCP's incremental bookkeeping agrees with the plan's own cost model
        assert math.isclose(after.info["makespan_after_s"], makespan_after, rel_tol=1e-9)
        assert math.isclose(after.info["makespan_before_s"], makespan_before, rel_tol=1e-9)
        assert after.total_bytes() <= before.total_bytes()
        assert sum(before.info["initial_bytes"]) == before.total_bytes()
    fast = mscc_fgcp_partition(W, abilities, go_ability=100.0)
    # FGCP only relieves the slowest worker, so it stops once that one has no outliers left (88% moved)
    assert fast.info["offloaded_nnz"] > 0.8 * fast.info["outliers"] and fast.go_part.nnz == fast.info["offloaded_nnz"]
    assert fast.total_bytes() < before.total_bytes()
    idle_go = mscc_fgcp_partition(W, abilities, go_ability=0.0)
    assert idle_go.go_part.nnz == 0 and idle_go.info["moves"] == 0


def test_fgcp_stops_when_the_go_would_become_the_bottleneck():
    W = random_sparse_matrix(300, 200, sparsity=0.7, seed=0)
    plan = mscc_fgcp_partition(W, [1.0, 1.0], go_ability=1e-3, wakeup_s=0.0)
    assert 0 < plan.info["offloaded_nnz"] < plan.info["outliers"]
    assert plan.go_compute_s() <= max(plan.estimated_s()) * (1 + 1e-9)


@pytest.mark.parametrize("rule", ["row", "col", "best"])
def test_outlier_rules_and_subsampled_clustering(rule):
    W = block_sparse_matrix(150, 100, blocks=2, sparsity=0.85, outlier_fraction=0.1, seed=5)
    plan = mscc_fgcp_partition(W, [1.0, 1.5], outlier_rule=rule, max_cluster_nnz=1000)
    if rule != "best":
        assert plan.info["rule"] == rule
    computed = linear_nonzeros(plan)
    assert np.unique(computed).size == computed.size == np.count_nonzero(W)
    x = torch.randn(100, dtype=torch.float64)
    assert torch.allclose(plan.apply(W, x), torch.as_tensor(W, dtype=torch.float64) @ x, atol=1e-10)
    base = rows_partition(W, [1.0, 1.5])
    assert plan.total_bytes() < base.total_bytes()


def test_one_worker():
    W = random_sparse_matrix(20, 30, sparsity=0.5, seed=0)
    plan = mscc_fgcp_partition(W, [2.0], go_ability=0.0)
    assert plan.part(0).nnz == np.count_nonzero(W) and plan.info["outliers"] == 0


# ----------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("planner", [rows_partition, mscc_fgcp_partition])
def test_bad_input_is_refused_clearly(planner):
    W = random_sparse_matrix(40, 50, sparsity=0.8, seed=0)
    with pytest.raises(ValueError, match="2 abilities for 3 workers"):
        planner(W, [1.0, 1.0], workers=3)
    for bad in ([1.0, 0.0], [1.0, -2.0], [1.0, float("nan")], [1.0, float("inf")]):
        with pytest.raises(ValueError, match="positive"):
            planner(W, bad)
    with pytest.raises(ValueError, match="empty"):
        planner(W, [])
    for not_2d in (np.ones(10), np.ones((2, 3, 4)), torch.ones(5)):
        with pytest.raises(ValueError, match="2-D"):
            planner(not_2d, [1.0, 1.0])
    with pytest.raises(ValueError, match="among 4 workers|too few"):
        planner(np.ones((3, 2)), [1.0] * 4)
    with pytest.raises(ValueError, match="sparsity_threshold"):
        planner(W, [1.0, 1.0], sparsity_threshold=1.5)


def test_bad_model_arguments():
    W = random_sparse_matrix(40, 50, sparsity=0.8, seed=0)
    with pytest.raises(ValueError, match="go_ability"):
        mscc_fgcp_partition(W, [1.0, 1.0], go_ability=-1.0)
    with pytest.raises(ValueError, match="throughput"):
        mscc_fgcp_partition(W, [1.0, 1.0], throughput=0.0)
    with pytest.raises(ValueError, match="outlier_rule"):
        mscc_fgcp_partition(W, [1.0, 1.0], outlier_rule="diagonal")
    with pytest.raises(ValueError, match="sparsity"):
        random_sparse_matrix(10, 10, sparsity=1.2)
    with pytest.raises(ValueError, match="blocks"):
        block_sparse_matrix(10, 10, blocks=11, sparsity=0.5)


# ----------------------------------------------------------------------------------------------
# Generators, cost model, accounting
# ----------------------------------------------------------------------------------------------


def test_generators_hit_the_sparsity_exactly():
    for sparsity in (0.0, 0.7, 0.9, 0.96, 1.0):
        W = random_sparse_matrix(50, 80, sparsity, seed=1)
        assert np.count_nonzero(W) == round((1 - sparsity) * 4000)
    for blocks, sparsity in ((3, 0.9), (4, 0.7), (2, 0.96)):  # (4, 0.7): full blocks, the excess are outliers
        W = block_sparse_matrix(120, 200, blocks, sparsity, outlier_fraction=0.1, seed=2, as_sparse=True)
        assert sp.issparse(W) and W.nnz == round((1 - sparsity) * 24000)
    a = block_sparse_matrix(50, 60, 2, 0.8, 0.1, seed=3)
    assert np.array_equal(a, block_sparse_matrix(50, 60, 2, 0.8, 0.1, seed=3))


def test_compute_cost_is_the_cheaper_format():
    assert compute_cost(0, 10, 10) == 0.0
    assert compute_cost(10, 10, 100, sparsity_threshold=0.75) == 40.0  # SpMV: 4 dense MACs per nonzero
    assert compute_cost(900, 10, 100, sparsity_threshold=0.75) == 1000.0  # GEMV
    assert compute_cost(10, 10, 100, sparsity_threshold=1.0) == 1000.0  # SpMV never wins


def test_layer_cost_table():
    rows = LayerCost("fc8", "rows", (600, 600), ((GO,), (GO,)), (0.01, 0.01), (0.05, 0.05))
    ours = LayerCost("fc8", "mscc+fgcp", (300, 400), ((GO,), (GO,)), (0.01, 0.02), (0.05, 0.05), go_compute_s=0.1)
    assert ours.total_bytes == 700 and ours.makespan_s == pytest.approx(0.1)
    assert ours.reduction_vs(rows) == pytest.approx(1 - 700 / 1200)
    table = format_cost_table([rows, ours], baseline_method="rows")
    assert "41.7%" in table and table.count("\n") == 3
    assert ours.as_dict()["peers"] == [[GO], [GO]]


# ----------------------------------------------------------------------------------------------
# SpMV / GEMV threshold
# ----------------------------------------------------------------------------------------------


def test_threshold_from_timings():
    grid = [0.0, 0.5, 0.8, 0.9, 0.99]
    assert threshold_from_timings(grid, [9, 5, 3, 1, 0.5], gemv_s=2.0) == pytest.approx(0.85)
    assert threshold_from_timings(grid, [9, 8, 7, 6, 5], gemv_s=2.0) == 1.0  # SpMV never wins
    assert threshold_from_timings(grid, [1, 1, 1, 1, 1], gemv_s=2.0) == 0.0  # always wins
    # a noisy bump at a sparse point pushes the threshold past it (SpMV must win at every sparser point)
    assert threshold_from_timings(grid, [9, 1, 1, 3, 1], gemv_s=2.0) == pytest.approx(0.945)
    with pytest.raises(ValueError, match="ascending"):
        threshold_from_timings([0.5, 0.2], [1, 1], 1.0)


def test_measured_threshold_is_consistent_with_its_timings():
    timings = sparsity_timings(256, 384, repeats=2, min_time_s=5e-4)
    assert 0.0 <= timings.threshold <= 1.0
    envelope = timings.envelope_s()
    assert all(a >= b for a, b in zip(envelope, envelope[1:]))  # non-increasing in sparsity
    for s, t in zip(timings.sparsities, envelope):
        if s > timings.threshold:
            assert t < timings.gemv_s and timings.spmv_faster(s)
        elif s < timings.threshold:
            assert t >= timings.gemv_s and not timings.spmv_faster(s)
    assert measure_sparsity_threshold(256, 384, repeats=2, min_time_s=5e-4) == timings.threshold  # cached
    assert sparsity_timings(256, 384, repeats=2, min_time_s=5e-4) is timings
    assert math.isclose(timings.density_threshold, 1 - timings.threshold)


def test_large_shapes_are_measured_scaled_down():
    timings = sparsity_timings(4096, 25088, sparsities=(0.5, 0.9, 0.99), repeats=1, min_time_s=1e-4, max_elements=1 << 16)
    assert timings.rows * timings.cols <= 1 << 16 and timings.cols > timings.rows


def test_the_partition_modules_import_each_other_without_cycles():
    """Module-level imports between ``lightning_hybrid.partition``'s modules form a DAG (``__init__`` aside)."""
    import ast
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "lightning_hybrid" / "partition"
    prefix = "lightning_hybrid.partition."
    graph = {}
    for path in folder.glob("*.py"):
        if path.stem == "__init__":
            continue
        body = ast.parse(path.read_text()).body
        graph[path.stem] = {node.module[len(prefix):] for node in body
                            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(prefix)}
    assert {"fc_cost", "fc_partition", "fgcp", "mscc", "sparse", "proportional"} <= set(graph)
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        if module not in done:
            for dependency in graph.get(module, ()):
                visit(dependency, (*path, module))
            done.add(module)

    for module in graph:
        visit(module, ())
