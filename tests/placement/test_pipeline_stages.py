"""Placing a model's stages by the blocks' measured times (``placement="time"``), plain torch."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from lightning_hybrid.devices import Device
from lightning_hybrid.placement.pipeline_stages import plan_stages


class Slow(nn.Module):
    """A block that takes time without FLOPs a counter sees (as a layer the device runs slowly would)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return x * self.scale


def stages(method: str, example: torch.Tensor, options: dict | None = None, speeds: tuple[float, float] = (1e9, 1e9),
           net: nn.Module | None = None) -> list[tuple[int, int, int]]:
    """Each stage's (start, stop, device)."""
    torch.manual_seed(0)
    net = net if net is not None else nn.Sequential(Slow(0.1), Slow(0.1), nn.Linear(64, 64), nn.Linear(64, 64))
    devices = [Device("a", speed=speeds[0], memory=1e12), Device("b", speed=speeds[1], memory=1e12)]
    placement = plan_stages(net, example, devices, method, stages=2, objective="bottleneck", seed=0, options=options or {},
                            optimizer_slots=1, in_flight=1)
    return sorted((s.start, s.stop, s.device) for s in placement.stages)


def test_time_weighs_a_block_by_the_time_it_takes_even_from_a_shape_alone():
    flops = {"block_cost": "flops"}
    assert [s[:2] for s in stages("exact", torch.randn(4, 64), flops)] == [(0, 3), (3, 4)]  # by FLOPs the slow blocks are free
    assert [s[:2] for s in stages("exact", torch.randn(4, 64))] == [(0, 1), (1, 4)]  # the default, "auto": timed
    assert [s[:2] for s in stages("time", torch.randn(4, 64))] == [(0, 1), (1, 4)]  # timed: each slow block is half the work
    # planned from a shape before any batch (input_shape=): timed on values made for it, not refused
    assert [s[:2] for s in stages("time", torch.empty(4, 64, device="meta"))] == [(0, 1), (1, 4)]


def test_a_method_given_the_blocks_measured_times_still_weighs_the_devices_speeds():
    """``block_cost="time"``: exact (or GABRA) on each block's measured time in place of its FLOPs, divided by
    the devices' speeds as FLOPs are. Blocks of 20, 20 and 80 ms (no FLOPs a counter sees) on devices of speeds
    1 and 4: the slow device takes the first block alone (20 ms), the fast one the rest (100 / 4 = 25 ms);
    by FLOPs the slow blocks are free, and by time alone (torchgpipe's balance) the speeds are ignored."""
    net = nn.Sequential(Slow(0.02), Slow(0.02), Slow(0.08), nn.Linear(64, 64))
    x = torch.randn(4, 64)
    assert stages("exact", x, {"block_cost": "time"}, speeds=(1e9, 4e9), net=net) == [(0, 1, 0), (1, 4, 1)]
    assert stages("exact", x, {"block_cost": "time"}, speeds=(4e9, 1e9), net=net) == [(0, 1, 1), (1, 4, 0)]
    with pytest.raises(ValueError, match=r"block_cost must be one of \('auto', 'time', 'flops'\)"):
        stages("exact", x, {"block_cost": "seconds"}, net=net)


def test_auto_times_a_model_built_on_the_meta_device_one_block_at_a_time():
    """A model created on the meta device (configure_model()) is timed block by block on copies made real, and
    placed by time as a built one is; a block that cannot run apart is placed by its FLOPs, said in the log."""
    from lightning_hybrid.pipeline.materialize import meta_copy

    built = nn.Sequential(Slow(0.1), Slow(0.1), nn.Linear(64, 64), nn.Linear(64, 64))
    meta = meta_copy(built)
    assert [s[:2] for s in stages("exact", torch.empty(4, 64, device="meta"), net=meta)] == [(0, 1), (1, 4)]
    assert all(p.is_meta for p in meta.parameters())  # nothing of the model itself was materialised
    devices = [Device("a", speed=1e9, memory=1e12), Device("b", speed=1e9, memory=1e12)]
    placement = plan_stages(built, torch.randn(4, 64), devices, "exact", stages=2, objective="bottleneck", seed=0,
                            options={}, optimizer_slots=1, in_flight=1)
    assert placement.notes["block_cost"] == "time"


def test_auto_falls_back_to_flops_where_a_block_cannot_be_timed(caplog):
    class Refuses(nn.Linear):
        def forward(self, x):
            if not x.is_meta:
                raise RuntimeError("runs on the accelerator only")
            return super().forward(x)

    devices = [Device("a", speed=1e9, memory=1e12), Device("b", speed=1e9, memory=1e12)]
    with caplog.at_level("INFO"):
        placement = plan_stages(nn.Sequential(Refuses(64, 64), nn.Linear(64, 64)), torch.randn(4, 64), devices, "exact",
                                stages=2, objective="bottleneck", seed=0, options={}, optimizer_slots=1, in_flight=1)
    assert placement.notes["block_cost"] == "flops" and "placed by their FLOPs" in caplog.text
