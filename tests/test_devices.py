"""lightning_hybrid.devices: what a speed or ability number means, and the conversions between units."""

from __future__ import annotations

import ast
import itertools
import math
from pathlib import Path

import numpy as np
import pytest

import lightning_hybrid.devices as devices_module
import lightning_hybrid.placement as placement
from lightning_hybrid.devices import (
    FLOPS_PER_MAC,
    REFERENCE_ABILITY_FLOPS,
    Device,
    devices_in_flops,
    flops_per_unit,
    macs_per_unit,
    probe_speed,
    to_flops,
    to_macs,
)
from lightning_hybrid.partition import ABILITY_UNIT, block_sparse_matrix, mscc_fgcp_partition, rows_partition

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_hybrid"


def test_speed_units_convert_through_flops():
    assert FLOPS_PER_MAC == 2
    assert to_flops(3e9, "flop/s") == 3e9
    assert to_flops(3e9, "mac/s") == 6e9
    assert to_macs(6e9, "flop/s") == 3e9
    assert to_macs(3e9, "mac/s") == 3e9
    assert to_flops(1.5, "relative", reference_flops=4e9) == 6e9
    assert to_macs(1.5, "relative", reference_flops=4e9) == 3e9
    for unit in ("flop/s", "mac/s"):
        assert macs_per_unit(unit) * FLOPS_PER_MAC == flops_per_unit(unit)


def test_the_units_partitioned_inference_and_the_fc_cost_model_use():
    # given abilities: relative to a 1 GMAC/s device; probed ones: FLOP/s
    assert REFERENCE_ABILITY_FLOPS == 2e9
    assert ABILITY_UNIT == macs_per_unit("relative", REFERENCE_ABILITY_FLOPS) == 1e9
    assert macs_per_unit("flop/s") == 0.5


def test_relative_speeds_need_a_reference_and_unknown_units_are_refused():
    for reference in (None, 0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match="reference_flops"):
            flops_per_unit("relative", reference)
    with pytest.raises(ValueError, match="unknown speed unit 'gflops'"):
        to_flops(1.0, "gflops")


def test_devices_in_flops_scales_speeds_only():
    given = [Device("a", speed=1.0, memory=8.0, bandwidth=5.0), Device("b", speed=2.5)]
    scaled = devices_in_flops(given, "relative", reference_flops=4e9)
    assert [d.speed for d in scaled] == [4e9, 1e10]
    assert [(d.name, d.memory, d.bandwidth) for d in scaled] == [("a", 8.0, 5.0), ("b", math.inf, math.inf)]
    assert devices_in_flops(given, "flop/s") == given


def test_probe_speed_counts_two_flops_per_multiply_accumulate_and_applies_the_slowdown(monkeypatch):
    clock = itertools.count(0.0, 0.5)  # every perf_counter call advances half a second
    monkeypatch.setattr(devices_module.time, "perf_counter", lambda: next(clock))
    # start at 0.0, products end at 0.5 and 1.0: 2 products of 4 x 4 matrices (64 MACs each) in 1 s
    assert probe_speed("cpu", seconds=1.0, size=4, slowdown=2.0) == 2 * 2 * 64 / 1.0 / 2.0


def test_abilities_in_flops_with_their_unit_plan_as_relative_ones():
    """The same devices described in FLOP/s (as probed) or relative to 1 GMAC/s give the same FC plan."""
    W = block_sparse_matrix(120, 180, blocks=3, sparsity=0.9, outlier_fraction=0.1, seed=0)
    relative, go = [1.0, 2.0, 1.5], 1.0
    flops = [to_flops(a, "relative", REFERENCE_ABILITY_FLOPS) for a in relative]
    go_flops = to_flops(go, "relative", REFERENCE_ABILITY_FLOPS)
    a = mscc_fgcp_partition(W, relative, go_ability=go)
    b = mscc_fgcp_partition(W, flops, go_ability=go_flops, ability_unit=macs_per_unit("flop/s"))
    assert np.array_equal(a.owner, b.owner)
    assert np.allclose(a.estimated_s(), b.estimated_s(), rtol=1e-12)
    assert np.allclose(rows_partition(W, relative).compute_s(),
                       rows_partition(W, flops, ability_unit=macs_per_unit("flop/s")).compute_s(), rtol=1e-12)


def test_placement_reexports_the_devices_module():
    assert placement.Device is Device
    assert placement.devices_from_config is devices_module.devices_from_config
    assert placement.probe_speed is probe_speed


def test_the_devices_module_needs_no_lightning_and_no_other_part_of_the_package():
    tree = ast.parse((PACKAGE / "devices.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not {m for m in imported if m.startswith(("lightning", "pytorch_lightning", "lightning_hybrid"))}
