"""Placing a model's stages by the blocks' measured times (``placement="time"``), plain torch."""

from __future__ import annotations

import time

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


def stages(method: str, example: torch.Tensor) -> list[tuple[int, int]]:
    torch.manual_seed(0)
    net = nn.Sequential(Slow(0.1), Slow(0.1), nn.Linear(64, 64), nn.Linear(64, 64))
    devices = [Device("a", speed=1e9, memory=1e12), Device("b", speed=1e9, memory=1e12)]
    placement = plan_stages(net, example, devices, method, stages=2, objective="bottleneck", seed=0, options={},
                            optimizer_slots=1, in_flight=1)
    return sorted((s.start, s.stop) for s in placement.stages)


def test_time_weighs_a_block_by_the_time_it_takes_even_from_a_shape_alone():
    assert stages("exact", torch.randn(4, 64)) == [(0, 3), (3, 4)]  # by FLOPs the slow blocks are free
    assert stages("time", torch.randn(4, 64)) == [(0, 1), (1, 4)]  # timed: each slow block is half the work
    # planned from a shape before any batch (input_shape=): timed on values made for it, not refused
    assert stages("time", torch.empty(4, 64, device="meta")) == [(0, 1), (1, 4)]
