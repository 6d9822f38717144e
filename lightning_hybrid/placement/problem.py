"""The placement problem: blocks in pipeline order, devices of different speed, memory and bandwidth.

A placement cuts the block sequence into ``k`` contiguous stages and gives each stage its own
device; the order of the devices along the pipeline is free. A stage's time per step is the compute
of its blocks on its device plus sending its last block's output to the next stage over the
device's link (no transfer after the last stage). The largest stage time, the bottleneck, sets a
pipeline's throughput. Each stage's blocks must fit the device's memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from lightning_hybrid.devices import Device


class InfeasiblePlacementError(ValueError):
    """No placement (or not the requested one) fits the devices; the message says what to change."""


@dataclass(frozen=True)
class Block:
    """One candidate partition of the model.

    Args:
        name: the block's name in the model.
        cost: compute per training step, in the units of :attr:`Device.speed` per second (FLOPs of
            forward and backward from :func:`~lightning_hybrid.placement.profile_blocks`, for speeds
            in FLOP/s; see :mod:`lightning_hybrid.devices`).
        out_bytes: bytes of the block's output activation (sent to the next stage if a cut follows).
        memory: bytes the block needs on its device (parameters, gradients, optimizer state and
            activations kept for backward).
        params: number of parameters (used by the ``"parameters"`` method).
        time: measured seconds per step on a reference device, or ``None`` (used by ``"time"``).
        workspace: bytes needed at once beside ``memory`` while the block's gradients accumulate over
            micro-batches (the largest parameter: autograd computes a micro-batch's gradient apart,
            then adds it); a stage needs the largest of its blocks' workspaces, not their sum.
        shared_with_previous: bytes of ``memory`` that the block before counts too: its output, which
            both keep for their backwards (a ReLU's result, the next convolution's input); a stage
            holding both blocks counts them once (:func:`stage_bytes`).
    """

    name: str
    cost: float
    out_bytes: float = 0.0
    memory: float = 0.0
    params: int = 0
    time: float | None = None
    workspace: float = 0.0
    shared_with_previous: float = 0.0

    def __post_init__(self) -> None:
        for what in ("cost", "out_bytes", "memory", "workspace", "shared_with_previous"):
            value = getattr(self, what)
            if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
                raise ValueError(f"block {self.name!r}: {what} must be a finite number >= 0, got {value!r}")
        if self.shared_with_previous > self.memory:
            raise ValueError(f"block {self.name!r}: shared_with_previous ({self.shared_with_previous}) exceeds its "
                             f"memory ({self.memory})")


def stage_bytes(blocks: Sequence[Block]) -> float:
    """Memory a run of blocks needs on one device: their sum, less what each shares with the block before it
    in the run, plus the largest of their workspaces."""
    return float(sum(b.memory for b in blocks) - sum(b.shared_with_previous for b in blocks[1:])
                 + max(b.workspace for b in blocks))


@dataclass(frozen=True)
class Stage:
    """Blocks ``start:stop`` on device ``device`` (an index into the devices list)."""

    device: int
    start: int
    stop: int
    compute_s: float
    transfer_s: float
    memory: float

    @property
    def time_s(self) -> float:
        return self.compute_s + self.transfer_s


@dataclass(frozen=True)
class Placement:
    """Stages in pipeline order, with their predicted times.

    ``bottleneck`` is the largest stage time (seconds per step when the pipeline is full);
    ``seconds`` the solver's wall time; ``fitness`` the solver's own objective value (GABRA);
    ``feasible`` whether every stage fits its device's memory.
    """

    method: str
    stages: tuple[Stage, ...]
    seconds: float = 0.0
    objective: str = "bottleneck"
    fitness: float | None = None
    generations: int | None = None
    feasible: bool = True
    notes: dict = field(default_factory=dict)

    @property
    def bottleneck(self) -> float:
        return max(stage.time_s for stage in self.stages)

    @property
    def device_order(self) -> list[int]:
        return [stage.device for stage in self.stages]

    @property
    def boundaries(self) -> list[tuple[int, int]]:
        return [(stage.start, stage.stop) for stage in self.stages]

    def stage_of_block(self, index: int) -> int:
        for s, stage in enumerate(self.stages):
            if stage.start <= index < stage.stop:
                return s
        raise IndexError(f"block {index} is in no stage")

    def to_dict(self) -> dict:
        """Plain types only (for logs, JSON and broadcasting)."""
        return {
            "method": self.method,
            "objective": self.objective,
            "bottleneck_s": self.bottleneck,
            "solver_s": self.seconds,
            "stages": [
                {"device": s.device, "blocks": [s.start, s.stop], "compute_s": s.compute_s,
                 "transfer_s": s.transfer_s, "memory": s.memory}
                for s in self.stages
            ],
        }


class Problem:
    """Blocks and devices with the arrays every solver needs (prefix sums, stage-time tables).

    ``held_messages``: copies of its input and of its output a stage keeps for its messages at once (the
    pipeline's micro-batches: a stage keeps each activation it sends and each input gradient it sends back
    until the step's sends have finished); each stage's memory counts them, from the sizes at its cuts.
    """

    def __init__(self, blocks: Sequence[Block], devices: Sequence[Device], stages: int | None = None,
                 held_messages: int = 0) -> None:
        self.blocks = list(blocks)
        self.devices = list(devices)
        n, m = len(self.blocks), len(self.devices)
        if n == 0:
            raise ValueError("no blocks to place: the model exposes an empty block sequence")
        if m == 0:
            raise ValueError("no devices to place blocks on")
        self.k = m if stages is None else int(stages)
        if not 1 <= self.k <= m:
            raise ValueError(f"stages must be between 1 and the number of devices ({m}), got {stages}")
        if self.k > n:
            raise InfeasiblePlacementError(
                f"{self.k} pipeline stages but the model has only {n} blocks ({', '.join(b.name for b in self.blocks)}); "
                f"use at most {n} stages, or a model cut into more blocks"
            )
        self.n, self.m = n, m
        self.held_messages = held_messages
        self.cost_prefix = np.concatenate([[0.0], np.cumsum([b.cost for b in self.blocks], dtype=float)])
        # M[i, j]: stage_bytes(blocks[i:j]) for j > i, from prefix sums (of what each block adds to the one
        # before it, plus what the first shares) and running maxima
        shared = np.array([b.shared_with_previous for b in self.blocks] + [0.0], dtype=float)
        self.memory_prefix = np.concatenate([[0.0], np.cumsum([b.memory for b in self.blocks] - shared[:-1], dtype=float)])
        workspace = np.array([b.workspace for b in self.blocks], dtype=float)
        largest = np.zeros((n + 1, n + 1))
        for i in range(n):
            largest[i, i + 1:] = np.maximum.accumulate(workspace[i:])
        # the messages at its cuts: the input gradient of a stage starting at i sent back, the output of one ending at j
        cut = np.array([0.0] + [b.out_bytes for b in self.blocks[:-1]] + [0.0]) * held_messages
        self.stage_memory = (self.memory_prefix[None, :] - self.memory_prefix[:, None] + shared[:, None] + largest
                             + cut[:, None] + cut[None, :])
        self._tables: dict[int, np.ndarray] = {}
        self._check_memory()

    def _check_memory(self) -> None:
        total = stage_bytes(self.blocks)
        largest = sorted((d.memory for d in self.devices), reverse=True)[: self.k]
        if total > sum(largest):
            raise InfeasiblePlacementError(
                f"the model needs {total / 2**20:.1f} MiB but the {self.k} largest devices hold "
                f"{sum(largest) / 2**20:.1f} MiB together; add devices, devices with more memory, or a smaller model/batch"
            )
        biggest_block = max(self.blocks, key=lambda b: stage_bytes([b]))
        if stage_bytes([biggest_block]) > max(d.memory for d in self.devices):
            raise InfeasiblePlacementError(
                f"block {biggest_block.name!r} needs {stage_bytes([biggest_block]) / 2**20:.1f} MiB, more than any device holds "
                f"({max(d.memory for d in self.devices) / 2**20:.1f} MiB); it cannot be placed whole"
            )

    def stage_time(self, start: int, stop: int, device: int) -> tuple[float, float]:
        """(compute seconds, transfer seconds) of blocks ``start:stop`` on ``device``."""
        d = self.devices[device]
        compute = (self.cost_prefix[stop] - self.cost_prefix[start]) / d.speed
        transfer = self.blocks[stop - 1].out_bytes / d.bandwidth if stop < self.n else 0.0
        return float(compute), float(transfer)

    def table(self, device: int) -> np.ndarray:
        """``T[i, j]``: time of blocks ``i:j`` on ``device``; ``inf`` where ``j <= i`` or they do not fit."""
        if device not in self._tables:
            d = self.devices[device]
            n = self.n
            i = np.arange(n + 1)[:, None]
            j = np.arange(n + 1)[None, :]
            compute = (self.cost_prefix[j] - self.cost_prefix[i]) / d.speed
            out = np.array([b.out_bytes for b in self.blocks] + [0.0])
            transfer = np.where(j < n, out[np.maximum(j - 1, 0)] / d.bandwidth, 0.0)
            fits = self.stage_memory <= d.memory
            self._tables[device] = np.where((j > i) & fits, compute + transfer, np.inf)
        return self._tables[device]

    def placement(self, method: str, order: Sequence[int], bounds: Sequence[tuple[int, int]], **extra) -> Placement:
        """Build a :class:`Placement` from a device order and stage bounds (checks memory)."""
        stages = []
        feasible = True
        for device, (start, stop) in zip(order, bounds):
            compute, transfer = self.stage_time(start, stop, device)
            memory = float(self.stage_memory[start, stop])
            feasible &= memory <= self.devices[device].memory
            stages.append(Stage(int(device), int(start), int(stop), compute, transfer, memory))
        return Placement(method=method, stages=tuple(stages), feasible=feasible, **extra)

    def best_cuts(self, order: Sequence[int]) -> tuple[float, list[tuple[int, int]]]:
        """The stage bounds that minimise the bottleneck for this device order (exact DP, O(k n^2)).

        Returns ``(bottleneck, bounds)``; the bottleneck is ``inf`` when no cut fits the memory.
        """
        return min_max_cuts([self.table(device) for device in order])

    def fill_table(self, device: int) -> np.ndarray:
        """``F[i, j]``: the fraction of ``device``'s memory blocks ``i:j`` fill; ``inf`` where ``j <= i``."""
        n = self.n
        i, j = np.arange(n + 1)[:, None], np.arange(n + 1)[None, :]
        return np.where(j > i, self.stage_memory / self.devices[device].memory, np.inf)

    def fullest(self, placement: Placement) -> tuple[int, float]:
        """(stage, fraction of its device's memory) of the stage that fills its device the most."""
        fills = [stage.memory / self.devices[stage.device].memory for stage in placement.stages]
        s = int(np.argmax(fills))
        return s, float(fills[s])

    def lower_bound(self) -> float:
        """No placement on ``k`` of these devices has a smaller bottleneck than this."""
        fastest = sorted((d.speed for d in self.devices), reverse=True)
        balanced = self.cost_prefix[-1] / sum(fastest[: self.k])
        largest_block = max(b.cost for b in self.blocks) / fastest[0]
        return float(max(balanced, largest_block))


def memory_table(blocks: Sequence[Block], devices: Sequence[Device], stages: int, placement: Placement | None = None) -> str:
    """Each stage's memory against its device's, as lines a refusal can show: ``placement``'s stages,
    or (without one) an even split over the devices in order, with each block's need."""
    if placement is not None:
        bounds, order = placement.boundaries, placement.device_order
    else:
        cuts = np.linspace(0, len(blocks), stages + 1).round().astype(int)
        bounds, order = list(zip(cuts[:-1], cuts[1:])), list(range(stages))
    mib = 2.0**20
    lines = []
    for s, ((start, stop), device) in enumerate(zip(bounds, order)):
        need = stage_bytes(blocks[start:stop])
        holds = devices[device].memory
        verdict = "fits" if need <= holds else f"short by {(need - holds) / mib:.1f} MiB"
        lines.append(f"  stage {s}: blocks {blocks[start].name}..{blocks[stop - 1].name} need {need / mib:.1f} MiB "
                     f"(parameters, gradients, optimizer state, activations) on {devices[device].name}, which holds "
                     f"{holds / mib:.1f} MiB: {verdict}")
    if placement is None:
        lines.insert(0, "  split evenly, for illustration:")
    lines.append("  per block: " + ", ".join(f"{b.name} {b.memory / mib:.1f} MiB" for b in blocks))
    return "\n".join(lines)


def min_max_cuts(tables: Sequence[np.ndarray]) -> tuple[float, list[tuple[int, int]]]:
    """Cut ``0..n`` into ``len(tables)`` non-empty contiguous parts minimising the largest part cost,
    part ``s`` of ``i:j`` costing ``tables[s][i, j]`` (``inf``: not allowed). Returns ``(cost, bounds)``,
    ``(inf, [])`` when no cut is allowed."""
    n = tables[0].shape[0] - 1
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    choices = []
    for table in tables:
        candidates = np.maximum(best[:, None], table)  # [i, j]
        arg = np.argmin(candidates, axis=0)
        best = candidates[arg, np.arange(n + 1)]
        choices.append(arg)
    if not np.isfinite(best[n]):
        return math.inf, []
    bounds = []
    stop = n
    for arg in reversed(choices):
        start = int(arg[stop])
        bounds.append((start, stop))
        stop = start
    return float(best[n]), bounds[::-1]
