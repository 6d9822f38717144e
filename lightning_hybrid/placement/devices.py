"""Device descriptions from config, and a short probe of a device's speed."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lightning_hybrid.placement.problem import Device

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(value: Any) -> float:
    """Bytes (or bytes per second) from a number or a string like ``"16GiB"``, ``"10GB/s"``, ``"inf"``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip().lower().removesuffix("/s").replace(" ", "")
    if text in ("inf", "infinity", "none", "null"):
        return math.inf
    match = re.fullmatch(r"([0-9.]+(?:e[+-]?[0-9]+)?)([a-z]*)", text)
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(f"cannot read a size from {value!r}; write a number of bytes or e.g. '16GiB', '512MB', '10GB/s'")
    return float(match.group(1)) * _UNITS[match.group(2)]


def devices_from_config(config: Sequence[Any]) -> list[Device]:
    """Devices from a list whose items are a speed (a number), a mapping with ``speed`` and optionally
    ``name``, ``memory`` and ``bandwidth`` (numbers or strings like ``"16GiB"``), or a :class:`Device`.

    Example::

        >>> [d.speed for d in devices_from_config([1, {"speed": 2, "memory": "8GiB"}])]
        [1.0, 2.0]
    """
    devices = []
    for i, item in enumerate(config):
        if isinstance(item, Device):
            devices.append(item)
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            devices.append(Device(name=f"device{i}", speed=float(item)))
        elif isinstance(item, Mapping):
            unknown = set(item) - {"name", "speed", "memory", "bandwidth"}
            if unknown:
                raise ValueError(f"device {i}: unknown keys {sorted(unknown)}; use name, speed, memory, bandwidth")
            devices.append(
                Device(
                    name=str(item.get("name", f"device{i}")),
                    speed=float(item.get("speed", 1.0)),
                    memory=parse_size(item.get("memory", math.inf)),
                    bandwidth=parse_size(item.get("bandwidth", math.inf)),
                )
            )
        else:
            raise TypeError(f"device {i}: expected a speed, a mapping or a Device, got {item!r}")
    return devices


def probe_speed(device: torch.device | str = "cpu", seconds: float = 0.2, size: int = 256) -> float:
    """FLOP/s of float32 matrix products on ``device``, measured for about ``seconds``."""
    device = torch.device(device)
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    flops_per = 2 * size**3
    a @ b  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    count, start = 0, time.perf_counter()
    while True:
        a @ b
        count += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return count * flops_per / elapsed
