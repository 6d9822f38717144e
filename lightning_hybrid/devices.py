"""Devices and the units of their numbers: what a speed, an ability, a memory or a bandwidth means.

Plain Python and torch (no Lightning). Placement (:mod:`lightning_hybrid.placement`), the hybrid
strategy, partitioned inference and the FC cost model of :mod:`lightning_hybrid.partition` describe
devices with the helpers here:

* :class:`Device`: name, speed, memory (bytes) and link bandwidth (bytes per second);
* :func:`devices_from_config`: devices from numbers or mappings (sizes like ``"16GiB"``,
  ``"10GB/s"`` read by :func:`parse_size`);
* :func:`probe_speed`: this process's device speed, measured;
* :func:`positive_per_device`: given speeds or abilities checked (positive, finite, one per rank).

**Units of a speed or an ability.** A number that says how fast a device computes is in one of
:data:`SPEED_UNITS`:

* ``"flop/s"``: floating-point operations per second. :func:`probe_speed` measures this, and the
  placement's block costs are FLOPs (``torch.utils.flop_counter``), so a :class:`Device` speed in
  FLOP/s gives stage times in seconds.
* ``"mac/s"``: dense multiply-accumulates per second, the rate the FC cost model divides its
  compute by. One MAC is :data:`FLOPS_PER_MAC` (2) FLOPs.
* ``"relative"``: a multiple of a reference device's speed (``[1.0, 2.0]``: the second device is
  twice as fast as the first). Only the ratios mean something until a reference is chosen: the
  FLOP/s of a device of relative speed 1 (``reference_flops``).

Where each public API stands:

* :func:`~lightning_hybrid.placement.plan`: ``Device.speed`` is in the units of the blocks' cost
  per second, so FLOP/s for :func:`~lightning_hybrid.placement.profile_blocks`.
* ``HybridParallelStrategy(devices=...)``: given speeds are relative, with rank 0's probed FLOP/s as
  the reference (turned into FLOP/s by :func:`devices_in_flops` before planning, so that a link's
  bandwidth weighs against compute in seconds); probed devices (``devices=None``) are in FLOP/s.
* ``lightning-hybrid plan speeds_in=flops`` (default): the given speeds are relative, with this
  machine's probed FLOP/s as the reference; ``speeds_in=raw``: they are FLOP/s.
* ``PartitionedInferenceStrategy(abilities=...)`` and
  :func:`~lightning_hybrid.partition.plan_partition`: given abilities are relative, with
  :data:`REFERENCE_ABILITY_FLOPS` (1 GMAC/s, MoDNN's phones) as the reference; probed abilities
  (``abilities=None``) are FLOP/s. The spatial split only uses their ratios; the FC cost model
  turns them into MAC/s with ``ability_unit`` = :func:`macs_per_unit` of their unit.

Example::

    >>> to_flops(2.0, "relative", reference_flops=5e9), to_flops(3e9, "mac/s"), macs_per_unit("flop/s")
    (10000000000.0, 6000000000.0, 0.5)
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

# --------------------------------------------------------------------------------------------------
# Units of compute speed
# --------------------------------------------------------------------------------------------------

FLOPS_PER_MAC = 2
"""FLOPs in one multiply-accumulate (a multiply and an add)."""

SPEED_UNITS = ("relative", "flop/s", "mac/s")
"""What a speed or ability number can be in (see the module docstring)."""

REFERENCE_ABILITY_FLOPS = FLOPS_PER_MAC * 1e9
"""FLOP/s of a device of relative ability 1 in partitioned inference: 1 GMAC/s (MoDNN's phones)."""


def flops_per_unit(unit: str, reference_flops: float | None = None) -> float:
    """FLOP/s that a speed of 1.0 in ``unit`` stands for (``reference_flops``: the FLOP/s of a
    device of relative speed 1, needed for ``"relative"`` only).

    Example::

        >>> flops_per_unit("flop/s"), flops_per_unit("mac/s"), flops_per_unit("relative", reference_flops=4e9)
        (1.0, 2.0, 4000000000.0)
    """
    if unit == "flop/s":
        return 1.0
    if unit == "mac/s":
        return float(FLOPS_PER_MAC)
    if unit == "relative":
        if reference_flops is None or not (reference_flops > 0 and math.isfinite(reference_flops)):
            raise ValueError(
                f"relative speeds need reference_flops, the FLOP/s of a device of relative speed 1 "
                f"(a positive finite number), got {reference_flops!r}"
            )
        return float(reference_flops)
    raise ValueError(f"unknown speed unit {unit!r}; use one of {', '.join(SPEED_UNITS)}")


def macs_per_unit(unit: str, reference_flops: float | None = None) -> float:
    """MAC/s that a speed of 1.0 in ``unit`` stands for: the FC cost model's ``ability_unit``.

    Example::

        >>> macs_per_unit("relative", REFERENCE_ABILITY_FLOPS), macs_per_unit("flop/s")
        (1000000000.0, 0.5)
    """
    return flops_per_unit(unit, reference_flops) / FLOPS_PER_MAC


def to_flops(speed: float, unit: str, reference_flops: float | None = None) -> float:
    """``speed`` (in ``unit``) in FLOP/s."""
    return speed * flops_per_unit(unit, reference_flops)


def to_macs(speed: float, unit: str, reference_flops: float | None = None) -> float:
    """``speed`` (in ``unit``) in MAC/s.

    Example::

        >>> to_macs(1.0, "relative", REFERENCE_ABILITY_FLOPS), to_macs(8e9, "flop/s")
        (1000000000.0, 4000000000.0)
    """
    return speed * macs_per_unit(unit, reference_flops)


def positive_per_device(values: Sequence[float], what: str, count: int | None = None, per: str = "rank",
                        instead: str = "") -> list[float]:
    """``values`` as floats, or a ValueError unless they are positive finite numbers, one per ``per``
    (``count`` of them when given; ``instead`` ends that message with what else the user may do).

    Example::

        >>> positive_per_device([1, 2.5], "speeds", count=2)
        [1.0, 2.5]
    """
    try:
        floats = [float(v) for v in values]
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a list of positive numbers, one per {per}; got {values!r}") from None
    if not floats or any(isinstance(v, bool) or not (f > 0 and math.isfinite(f)) for v, f in zip(values, floats)):
        raise ValueError(f"{what} must be positive finite numbers, one per {per}; got {list(values)}")
    if count is not None and len(floats) != count:
        raise ValueError(f"{len(floats)} {what} for {count} {per}s: give one per {per}{instead}")
    return floats


# --------------------------------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    """A device a stage (or a part of a layer) can run on.

    Args:
        name: for messages and tables.
        speed: compute per second, in the units of the work it is given: FLOP/s for blocks from
            :func:`~lightning_hybrid.placement.profile_blocks` and from :func:`probe_speed`, or a
            relative speed if the costs are relative (see the module docstring).
        memory: bytes available to a stage (``inf``: no limit).
        bandwidth: bytes per second of the link to the next stage (``inf``: free transfers).
    """

    name: str = "device"
    speed: float = 1.0
    memory: float = math.inf
    bandwidth: float = math.inf

    def __post_init__(self) -> None:
        if not (isinstance(self.speed, (int, float)) and self.speed > 0 and math.isfinite(self.speed)):
            raise ValueError(f"device {self.name!r}: speed must be a finite number > 0, got {self.speed!r}")
        for what in ("memory", "bandwidth"):
            value = getattr(self, what)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"device {self.name!r}: {what} must be > 0 (inf for no limit), got {value!r}")


def devices_in_flops(devices: Sequence[Device], unit: str, reference_flops: float | None = None) -> list[Device]:
    """``devices`` with their speeds (given in ``unit``) turned into FLOP/s.

    Example::

        >>> [d.speed for d in devices_in_flops([Device(speed=1.0), Device(speed=2.0)], "relative", 3e9)]
        [3000000000.0, 6000000000.0]
    """
    per = flops_per_unit(unit, reference_flops)
    return [dataclasses.replace(d, speed=d.speed * per) for d in devices]


_SIZE_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(value: Any) -> float:
    """Bytes (or bytes per second) from a number or a string like ``"16GiB"``, ``"10GB/s"``, ``"inf"``.

    Example::

        >>> parse_size("16GiB"), parse_size("10GB/s"), parse_size(512)
        (17179869184.0, 10000000000.0, 512.0)
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip().lower().removesuffix("/s").replace(" ", "")
    if text in ("inf", "infinity", "none", "null"):
        return math.inf
    match = re.fullmatch(r"([0-9.]+(?:e[+-]?[0-9]+)?)([a-z]*)", text)
    if match is None or match.group(2) not in _SIZE_UNITS:
        raise ValueError(f"cannot read a size from {value!r}; write a number of bytes or e.g. '16GiB', '512MB', '10GB/s'")
    return float(match.group(1)) * _SIZE_UNITS[match.group(2)]


def devices_from_config(config: Sequence[Any]) -> list[Device]:
    """Devices from a list whose items are a speed (a number), a mapping with ``speed`` and optionally
    ``name``, ``memory`` and ``bandwidth`` (numbers or strings like ``"16GiB"``), or a :class:`Device`.

    Speeds are kept as given, in whatever unit the caller works in (see the module docstring).

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


def probe_speed(device: torch.device | str = "cpu", seconds: float = 0.2, size: int = 256, slowdown: float = 1.0) -> float:
    """FLOP/s of float32 matrix products on ``device``, measured for about ``seconds``, divided by
    ``slowdown`` (a rank whose compute :mod:`lightning_hybrid.sim` slows by that factor)."""
    device = torch.device(device)
    a = torch.full((size, size), 0.5, device=device)  # not drawn: the probe leaves the random stream alone
    b = torch.full((size, size), 0.25, device=device)
    flops_per = FLOPS_PER_MAC * size**3  # a size x size matrix product is size^3 multiply-accumulates
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
            return count * flops_per / elapsed / slowdown


def free_memory(device: torch.device | str = "cpu") -> float:
    """Bytes free on a CUDA ``device`` now; ``inf`` (no limit known) for any other device."""
    device = torch.device(device)
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    return math.inf


class PeakMemory:
    """The most memory this process held above a baseline, since :meth:`start`.

    CUDA: ``torch.cuda.max_memory_allocated`` over the allocation at the start (tensors only). CPU: the
    peak resident set (``VmHWM`` of ``/proc/self/status``, reset at the start through
    ``/proc/self/clear_refs``) over the resident set then, so that the interpreter, torch and
    Lightning are the baseline; the allocator's freed memory is given back first (:func:`release_free_memory`).
    The resident set counts what glibc keeps of freed memory too (its mmap threshold rises as large blocks are
    freed, up to 32 MiB, and heaps give back little), up to hundreds of MiB above the tensors' peak; a process
    started with ``MALLOC_MMAP_THRESHOLD_=65536`` maps each tensor apart and gives it back when freed, so that
    the peak is the tensors' own, as CUDA's (``benchmarks/whole_brain_memory.py`` measures so).
    ``resident``: bytes of tensors already held at the start that the peak should count (the model's
    parameters, the optimizer's state: :func:`held_bytes`), taken off the baseline. ``None`` where
    neither can be read (not Linux).
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.baseline: float | None = None

    def start(self, resident: float = 0.0) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = float(torch.cuda.memory_allocated(self.device)) - resident
            return
        release_free_memory()
        try:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")  # resets VmHWM to the current resident set
            self.baseline = _status_bytes("VmRSS") - resident
        except OSError:
            self.baseline = None

    def peak(self) -> float | None:
        """Bytes above the baseline at the peak, or None."""
        if self.baseline is None:
            return None
        if self.device.type == "cuda":
            return float(torch.cuda.max_memory_allocated(self.device)) - self.baseline
        return _status_bytes("VmHWM") - self.baseline


def held_bytes(device: torch.device | str, *holders: torch.nn.Module | torch.optim.Optimizer) -> float:
    """Bytes of the tensors ``holders`` keep on ``device``: modules' parameters and buffers, optimizers' state
    (none on the meta device)."""
    device, seen, total = torch.device(device), set(), 0.0
    for holder in holders:
        if isinstance(holder, torch.optim.Optimizer):
            tensors = [t for state in holder.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
        else:
            tensors = [*holder.parameters(), *holder.buffers()]
        for t in tensors:
            if t.device.type == device.type and id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
    return total


def release_free_memory() -> None:
    """Give the memory the C allocator holds freed back to the operating system (glibc's ``malloc_trim``), so that
    a resident-set measurement started now counts what is allocated from now on, not earlier work's leftovers."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _status_bytes(field: str) -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return float(line.split()[1]) * 1024
    raise OSError(f"no {field} in /proc/self/status")
