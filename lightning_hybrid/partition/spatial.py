"""Spatial partitioning of a network's convolutional part across workers (MoDNN's BODP, and a 2-D grid).

Paper 001 (MoDNN) splits each convolution's input along its longer edge in proportion to each
worker's computing ability (Biased One-Dimensional Partition, BODP): a worker computes the output
rows it owns from its own input rows plus the few rows its neighbours own (the halo), so only halo
slices travel and each worker has at most two peers. The conventional baseline splits the plane
into a 2-D grid (up to eight peers: edges and corners).

This module is the plan, free of any transport: :func:`plan_network` walks a network's layers
(nested ``nn.Sequential`` flattened), records every layer's shape for a given input, and decides
per layer how it runs:

* ``pointwise`` (activations, BatchNorm and Dropout in eval mode, ...): on each worker's slice,
  nothing travels;
* ``window`` (convolutions and poolings): each worker gets the input rows its output rows need
  from whoever owns them (the halo; zero or -inf padding only at the global borders), then computes
  exactly its own output rows;
* ``block`` (any other module that is spatially local, e.g. a residual block): the halo it needs is
  measured once on random data (the smallest overlap whose cropped output equals the whole
  computation); each worker computes the block on its rows plus that overlap and keeps its own rows;
* ``owner`` (anything else: flatten, fully-connected layers, global pooling, self-attention): the
  group owner (rank 0) gathers the whole tensor and runs the layer; a later local layer is
  scattered again.

:class:`Box` is a region of the split axes; ownership of every layer's output is one box per
worker. :func:`transfers` says which rows go from whom to whom for a layer, so the accounting
(bytes per boundary, peers per worker) follows from the plan before anything runs.

Example::

    >>> import torch
    >>> from lightning_hybrid.models import LeNet5
    >>> plan = plan_network(LeNet5().eval(), (1, 28, 28), abilities=[1.0, 2.0])
    >>> [(s.name, s.kind) for s in plan.steps][:3]
    [('c1.0', 'window'), ('c1.1', 'pointwise'), ('s2', 'window')]
    >>> plan.steps[0].out_boxes          # rows 0-8 to the slower worker, 9-27 to the faster one
    [Box(ranges=((0, 9),)), Box(ranges=((9, 28),))]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from lightning_hybrid.partition.proportional import proportional_split

OWNER = 0

_POINTWISE = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Hardtanh, nn.PReLU,
    nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LocalResponseNorm, nn.Softmax, nn.LogSoftmax,
)
_CONVS = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_MAX_POOLS = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOLS = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
CONV_PARTITIONS = ("bodp", "grid2d")


class PartitionError(ValueError):
    """The network or input cannot be partitioned as asked; the message says what to change."""


@dataclass(frozen=True)
class Box:
    """A region of the split axes: one ``(start, stop)`` per split axis."""

    ranges: tuple[tuple[int, int], ...]

    @property
    def empty(self) -> bool:
        return any(hi <= lo for lo, hi in self.ranges)

    def intersect(self, other: Box) -> Box:
        return Box(tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(self.ranges, other.ranges)))

    def clamp(self, lengths: Sequence[int]) -> Box:
        return Box(tuple((max(0, lo), min(n, hi)) for (lo, hi), n in zip(self.ranges, lengths)))

    def size(self) -> int:
        return math.prod(max(0, hi - lo) for lo, hi in self.ranges)


def module_device(module: nn.Module) -> torch.device:
    """Where ``module``'s parameters (or buffers) live; the CPU for a module without any."""
    tensor = next(iter([*module.parameters(), *module.buffers()]), None)
    return tensor.device if tensor is not None else torch.device("cpu")


def full_box(shape: Sequence[int], axes: Sequence[int]) -> Box:
    """All of a sample of ``shape`` (``Box(())`` when it no longer has the split axes, e.g. after flatten)."""
    return Box(tuple((0, shape[a]) for a in axes)) if len(shape) > max(axes) else Box(())


def grid_shape(workers: int) -> tuple[int, int]:
    """The most square ``g0 x g1 = workers`` grid (``g0 >= g1``)."""
    g1 = max(d for d in range(1, int(math.isqrt(workers)) + 1) if workers % d == 0)
    return workers // g1, g1


@dataclass
class Step:
    """One layer of the plan (see the module doc for the kinds)."""

    name: str
    module: nn.Module
    kind: str  # pointwise | window | block | owner
    in_shape: tuple[int, ...]  # one sample, without the batch dimension
    out_shape: tuple[int, ...]
    in_boxes: list[Box | None] = field(default_factory=list)  # per worker; None: holds nothing
    out_boxes: list[Box | None] = field(default_factory=list)
    needed: list[Box | None] = field(default_factory=list)  # input region each worker computes from (unclamped)
    halo: int = 0  # block: overlap in output rows
    note: str = ""  # why a spatial layer runs on the owner
    stride: tuple[int, ...] = ()  # block: input rows per output row, per split axis

    @property
    def spatial(self) -> bool:
        return self.kind != "owner"


@dataclass
class NetworkPlan:
    """The per-layer plan of one network for one input shape, split axes and abilities."""

    steps: list[Step]
    axes: tuple[int, ...]  # split axes, as dimensions of a sample (1 = the first spatial axis)
    workers: int
    scheme: str
    abilities: tuple[float, ...]


# ---------------------------------------------------------------------- layer classification
def _leaves(module: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    if isinstance(module, nn.Sequential):
        out: list[tuple[str, nn.Module]] = []
        for name, child in module.named_children():
            out += _leaves(child, f"{prefix}.{name}" if prefix else name)
        return out
    return [(prefix or type(module).__name__, module)]


#: Layers split over the input's spatial axes, by number of spatial dimensions.
SPATIAL_LAYERS_BY_DIMS = {
    1: (nn.Conv1d, nn.MaxPool1d, nn.AvgPool1d), 2: (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d),
    3: (nn.Conv3d, nn.MaxPool3d, nn.AvgPool3d),
}
SPATIAL_LAYERS = tuple(cls for classes in SPATIAL_LAYERS_BY_DIMS.values() for cls in classes)


def _spatial_dims(module: nn.Module) -> int | None:
    return next((dims for dims, classes in SPATIAL_LAYERS_BY_DIMS.items() if isinstance(module, classes)), None)


def _tuple(value, dims: int) -> tuple[int, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * dims


def _window_params(module: nn.Module) -> dict | None:
    """Kernel, stride, padding, dilation of a convolution or pooling we can run with manual padding."""
    dims = _spatial_dims(module)
    if dims is None:
        return None
    if isinstance(module, nn.modules.conv._ConvNd):
        if module.padding_mode != "zeros" or isinstance(module.padding, str) or isinstance(module, nn.modules.conv._ConvTransposeNd):
            return None
        return dict(dims=dims, kernel=module.kernel_size, stride=module.stride, padding=module.padding,
                    dilation=module.dilation, pad_value=0.0)
    if getattr(module, "ceil_mode", False):
        return None
    if isinstance(module, (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)):
        padding = _tuple(module.padding, dims)
        if any(padding) and not module.count_include_pad:
            return None
        return dict(dims=dims, kernel=_tuple(module.kernel_size, dims), stride=_tuple(module.stride or module.kernel_size, dims),
                    padding=padding, dilation=(1,) * dims, pad_value=0.0)
    return dict(dims=dims, kernel=_tuple(module.kernel_size, dims), stride=_tuple(module.stride or module.kernel_size, dims),
                padding=_tuple(module.padding, dims), dilation=_tuple(module.dilation, dims), pad_value=-math.inf)


@torch.no_grad()
def measure_halo(module: nn.Module, in_shape: Sequence[int], axis: int, seed: int = 0) -> tuple[int, int] | None:
    """(halo in output rows, input rows per output row) that make ``module`` exactly computable from
    overlapping slices along tensor dimension ``axis`` (0 is the batch), measured on random data; None if none does
    (the module is not spatially local along that axis, e.g. self-attention or global pooling)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, *in_shape, generator=generator).to(module_device(module))
    full = module(x)
    if full.dim() != x.dim():
        return None
    in_len, out_len = x.shape[axis], full.shape[axis]
    if out_len < 2 or in_len < out_len:  # too small to split, or upsampling
        return None
    stride = max(1, round(in_len / out_len))
    cuts = sorted({max(1, out_len // 3), out_len // 2, max(1, (2 * out_len) // 3)})
    scale = full.abs().max().item() + 1e-12
    for halo in range(0, max(1, out_len // 2)):  # an overlap of half the axis or more is not a split
        exact = True
        for cut in cuts:
            left_hi = min(in_len, (cut + halo) * stride)
            right_lo = max(0, (cut - halo) * stride)
            offset = right_lo // stride
            try:
                left = module(x.narrow(axis, 0, left_hi)) if left_hi > 0 else None
                right = module(x.narrow(axis, right_lo, in_len - right_lo))
                good = (
                    left is not None and left.shape[axis] >= cut and right.shape[axis] >= out_len - offset
                    and torch.allclose(left.narrow(axis, 0, cut), full.narrow(axis, 0, cut), atol=1e-5 * scale, rtol=1e-4)
                    and torch.allclose(right.narrow(axis, cut - offset, out_len - cut), full.narrow(axis, cut, out_len - cut),
                                       atol=1e-5 * scale, rtol=1e-4)
                )
            except RuntimeError:
                good = False
            if not good:
                exact = False
                break
        if exact:
            return halo, stride
    return None


def _classify(name: str, module: nn.Module, in_shape: tuple[int, ...], out_shape: tuple[int, ...], axes: tuple[int, ...]) -> Step:
    step = Step(name, module, "owner", in_shape, out_shape)
    spatial = len(in_shape) >= 2 and len(out_shape) == len(in_shape)
    if not spatial:
        return step
    if isinstance(module, _POINTWISE) and in_shape[1:] == out_shape[1:]:
        step.kind = "pointwise"
        return step
    params = _window_params(module)
    if params is not None and params["dims"] == len(in_shape) - 1:
        step.kind = "window"
        return step
    halos = []
    for axis in axes:
        measured = measure_halo(module, in_shape, axis + 1)
        if measured is None:
            if out_shape[axis] < 2 or in_shape[axis] < 2:
                step.note = f"too small to split ({in_shape[axis]} -> {out_shape[axis]} rows along the split axis): runs on the group owner"
            else:
                step.note = f"{type(module).__name__} is not spatially local along the split axis: it runs on the group owner"
            return step
        halos.append(measured)
    step.kind = "block"
    step.halo = max(h for h, _ in halos)
    step.stride = tuple(s for _, s in halos)
    return step


# ---------------------------------------------------------------------- ownership and needed regions
def _split_boxes(shape: tuple[int, ...], axes: tuple[int, ...], scheme: str, abilities: Sequence[float]) -> list[Box]:
    lengths = [shape[a] for a in axes]
    if scheme == "bodp":
        return [Box((r,)) for r in proportional_split(lengths[0], abilities)]
    g0, g1 = grid_shape(len(abilities))
    rows, cols = proportional_split(lengths[0], [1.0] * g0), proportional_split(lengths[1], [1.0] * g1)
    return [Box((rows[i // g1], cols[i % g1])) for i in range(len(abilities))]


def _needed(step: Step, out_box: Box, axes: tuple[int, ...]) -> Box:
    """The input region (unclamped: negative or past the end means padding) ``out_box`` needs."""
    if step.kind == "pointwise":
        return out_box
    ranges = []
    if step.kind == "window":
        p = _window_params(step.module)
        for (lo, hi), axis in zip(out_box.ranges, axes):
            i = axis - 1
            k, s, pad, d = p["kernel"][i], p["stride"][i], p["padding"][i], p["dilation"][i]
            ranges.append((lo * s - pad, (hi - 1) * s - pad + d * (k - 1) + 1) if hi > lo else (0, 0))
        return Box(tuple(ranges))
    for (lo, hi), axis, stride in zip(out_box.ranges, axes, step.stride):
        length = step.in_shape[axis]
        ranges.append((max(0, (lo - step.halo) * stride), min(length, (hi + step.halo) * stride)) if hi > lo else (0, 0))
    return Box(tuple(ranges))


def plan_network(
    net: nn.Module,
    sample_shape: Sequence[int],
    abilities: Sequence[float],
    scheme: str = "bodp",
) -> NetworkPlan:
    """The plan of ``net`` (in eval mode) for one sample of ``sample_shape`` on ``len(abilities)`` workers.

    ``scheme="bodp"`` splits along the input's longest spatial axis in proportion to ``abilities``;
    ``"grid2d"`` splits the two longest spatial axes into the most square grid, evenly (the
    conventional baseline ignores abilities).
    """
    if scheme not in CONV_PARTITIONS:
        raise PartitionError(f"unknown conv_partition {scheme!r}; choose one of {CONV_PARTITIONS}")
    abilities = tuple(float(a) for a in abilities)
    if not abilities or any(not (a > 0 and math.isfinite(a)) for a in abilities):
        raise PartitionError(f"abilities must be positive finite numbers, one per worker; got {list(abilities)}")
    if net.training:
        raise PartitionError("the network is in training mode: partitioned inference runs it in eval mode "
                             "(BatchNorm in training mode normalizes over the whole input)")
    sample_shape = tuple(int(s) for s in sample_shape)
    spatial = sample_shape[1:]
    if not spatial:
        raise PartitionError(f"input of shape {sample_shape} has no spatial axis to split (expected C x H x W or C x D x H x W)")
    order = sorted(range(len(spatial)), key=lambda i: (-spatial[i], i))
    if scheme == "bodp":
        axes = (order[0] + 1,)
    else:
        if len(spatial) < 2:
            raise PartitionError("grid2d needs at least two spatial axes")
        axes = tuple(sorted(a + 1 for a in order[:2]))
    workers = len(abilities)

    leaves = _leaves(net)
    shapes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    with torch.no_grad():
        x = torch.zeros(1, *sample_shape, device=module_device(net))
        for name, module in leaves:
            try:
                y = module(x)
            except RuntimeError as err:
                raise PartitionError(f"the network does not run on an input of shape {sample_shape}: layer {name}: {err}") from None
            shapes.append((tuple(x.shape[1:]), tuple(y.shape[1:])))
            x = y
    steps: list[Step] = []
    local = True  # once the tensor is no longer spatial, everything after runs on the owner
    for (name, module), (in_shape, out_shape) in zip(leaves, shapes):
        step = _classify(name, module, in_shape, out_shape, axes) if local else Step(name, module, "owner", in_shape, out_shape)
        if len(out_shape) < 2:
            local = False
        steps.append(step)

    _check_first_layer(steps, axes, scheme, abilities)
    owned: list[Box | None] = [full_box(sample_shape, axes) if w == OWNER else None for w in range(workers)]  # the input starts on the owner
    for step in steps:
        step.in_boxes = owned
        if step.kind == "owner":
            step.out_boxes = [full_box(step.out_shape, axes) if w == OWNER else None for w in range(workers)]
            step.needed = [full_box(step.in_shape, axes) if w == OWNER else None for w in range(workers)]
        else:
            if step.kind == "pointwise" and all(b is not None for b in owned):
                step.out_boxes = list(owned)
            else:
                step.out_boxes = _split_boxes(step.out_shape, axes, scheme, abilities)
            step.needed = [_needed(step, box, axes) for box in step.out_boxes]
            problem = _halo_problem(step, axes)
            if problem:  # a layer too small to split this way: it and everything after run on the owner
                step.note = f"runs on the group owner: {problem}"
                for later in steps[steps.index(step):]:
                    later.kind = "owner"
                    later.note = later.note or f"follows {step.name} on the group owner"
                step.out_boxes = [full_box(step.out_shape, axes) if w == OWNER else None for w in range(workers)]
                step.needed = [full_box(step.in_shape, axes) if w == OWNER else None for w in range(workers)]
        owned = step.out_boxes
    return NetworkPlan(steps, axes, workers, scheme, abilities)


def _check_first_layer(steps: list[Step], axes: tuple[int, ...], scheme: str, abilities: Sequence[float]) -> None:
    """Refuse an input so small that a worker's share of it is thinner than the first layer's halo."""
    first = next((s for s in steps if s.kind in ("window", "block")), None)
    if first is None:
        return
    if first.kind == "window":
        p = _window_params(first.module)
        # rows a slice needs from one side: the padding, or what the kernel reaches past it
        reach = max(max(p["padding"][a - 1], p["dilation"][a - 1] * (p["kernel"][a - 1] - 1) - p["padding"][a - 1])
                    for a in axes)
    else:
        reach = first.halo * max(first.stride)
    for box in _split_boxes(first.in_shape, axes, scheme, abilities):
        for lo, hi in box.ranges:
            if hi - lo < reach:
                lengths = [first.in_shape[a] for a in axes]
                raise PartitionError(
                    f"the input ({lengths} along the split axes) is too small for {len(abilities)} workers with abilities "
                    f"{list(abilities)}: a worker would get {hi - lo} rows, fewer than layer {first.name} "
                    f"needs from a neighbour ({reach} rows). Use a larger input or fewer workers."
                )


def _halo_problem(step: Step, axes: tuple[int, ...]) -> str:
    """Why a split does not work for ``step`` (its halo reaches past a neighbour's slice), or ""."""
    if step.kind == "pointwise" or any(b is None for b in step.in_boxes):
        return ""
    for w, need in enumerate(step.needed):
        if step.out_boxes[w].empty:  # a layer too small for every worker to get a row: this one idles
            continue
        sources = [q for q, box in enumerate(step.in_boxes) if q != w and not need.intersect(box).empty]
        neighbours = {q for q in sources if _adjacent(step.in_boxes[w], step.in_boxes[q])}
        if set(sources) - neighbours:
            lengths = [step.in_shape[a] for a in axes]
            return (f"its input ({lengths} along the split axes) is smaller than the halo worker {w} needs "
                    f"({need.ranges}), which would come from non-neighbouring workers {sorted(set(sources) - neighbours)}")
    return ""


def _adjacent(a: Box, b: Box) -> bool:
    """Whether two boxes touch (share a face, an edge or a corner)."""
    return all(lo1 <= hi2 and lo2 <= hi1 for (lo1, hi1), (lo2, hi2) in zip(a.ranges, b.ranges))


# ---------------------------------------------------------------------- transfers and local compute
def transfers(step: Step) -> list[tuple[int, int, Box]]:
    """``(source, destination, region)`` of every piece of input that travels before ``step``."""
    if step.kind == "pointwise" and step.out_boxes == step.in_boxes:
        return []
    out = []
    for dst, need in enumerate(step.needed):
        if need is None:
            continue
        for src, box in enumerate(step.in_boxes):
            if src == dst or box is None:
                continue
            piece = need.intersect(box)
            if not piece.empty:
                out.append((src, dst, piece))
    return out


def slice_box(x: torch.Tensor, origin: Box, region: Box, axes: tuple[int, ...]) -> torch.Tensor:
    """The part of ``x`` (a batch holding ``origin`` of the split axes) that covers ``region``."""
    for (lo, hi), (olo, _), axis in zip(region.ranges, origin.ranges, axes):
        x = x.narrow(axis + 1, lo - olo, hi - lo)
    return x.contiguous()


def compute(step: Step, worker: int, x: torch.Tensor, axes: tuple[int, ...]) -> torch.Tensor:
    """Worker ``worker``'s output rows of ``step`` from ``x``, its clamped needed input region."""
    if step.kind in ("pointwise", "owner"):
        return step.module(x)
    need, out_box = step.needed[worker], step.out_boxes[worker]
    lengths = [step.in_shape[a] for a in axes]
    if step.kind == "window":
        p = _window_params(step.module)
        dims = p["dims"]
        padding = list(p["padding"])
        pads = [0, 0] * dims  # F.pad order: last dimension first
        for (lo, hi), axis, n in zip(need.ranges, axes, lengths):
            i = axis - 1
            padding[i] = 0
            pads[2 * (dims - 1 - i)] = max(0, -lo)
            pads[2 * (dims - 1 - i) + 1] = max(0, hi - n)
        if any(pads):
            x = F.pad(x, pads, value=p["pad_value"])
        m = step.module
        if isinstance(m, nn.modules.conv._ConvNd):
            return _CONVS[dims](x, m.weight, m.bias, m.stride, tuple(padding), m.dilation, m.groups)
        if p["pad_value"] == -math.inf:
            return _MAX_POOLS[dims](x, p["kernel"], p["stride"], tuple(padding), p["dilation"])
        return _AVG_POOLS[dims](x, p["kernel"], p["stride"], tuple(padding), False, m.count_include_pad)
    y = step.module(x)  # block: computed with overlap, then cropped to this worker's rows
    for (lo, hi), (nlo, _), axis, stride in zip(out_box.ranges, need.ranges, axes, step.stride):
        y = y.narrow(axis + 1, lo - nlo // stride, hi - lo)
    return y
