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
    assert [s[:2] for s in stages("exact", torch.randn(4, 64))] == [(0, 3), (3, 4)]  # by FLOPs the slow blocks are free
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
    with pytest.raises(ValueError, match="block_cost must be 'flops' or 'time'"):
        stages("exact", x, {"block_cost": "seconds"}, net=net)
