"""Running a :class:`~lightning_hybrid.partition.spatial.NetworkPlan`: over torch.distributed, or simulated in one process.

Every worker holds, after each layer, the output rows its box names. Before a layer, the pieces
:func:`~lightning_hybrid.partition.spatial.transfers` lists travel point to point (the halos; a
gather to the group owner before a layer that runs there; a scatter after it), each worker
assembles its input region and computes its rows. :class:`DistributedExecutor` does this with
``isend``/``irecv`` on a process group and times compute and transfer per layer;
:func:`simulate` does the same moves by slicing in one process (tests, and the accounting of a
plan without processes). :func:`plan_traffic` gives the bytes and peers per layer and worker from
the plan alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from lightning_hybrid.comm.collectives import exchange, start_exchange
from lightning_hybrid.partition.fc_cost import GO
from lightning_hybrid.partition.fc_partition import FCPartition
from lightning_hybrid.partition.network import PartitionPlan, fc_weights
from lightning_hybrid.partition.spatial import OWNER, Box, Step, compute, full_box, slice_box, transfers
from lightning_hybrid.sim.slowdown import stretch


def _piece_shape(batch: int, shape: tuple[int, ...], region: Box, axes: tuple[int, ...]) -> list[int]:
    dims = [batch, *shape]
    for (lo, hi), axis in zip(region.ranges, axes):
        dims[axis + 1] = hi - lo
    return dims


def assemble(pieces: list[tuple[Box, torch.Tensor]], region: Box, batch: int, shape: tuple[int, ...],
             axes: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """The batch covering ``region`` of a layer's input, put together from ``(box, tensor)`` pieces."""
    if len(pieces) == 1 and pieces[0][0] == region:
        return pieces[0][1]
    out = like.new_empty(_piece_shape(batch, shape, region, axes))
    covered = 0
    for box, tensor in pieces:
        target = out
        for (lo, hi), (rlo, _), axis in zip(box.ranges, region.ranges, axes):
            target = target.narrow(axis + 1, lo - rlo, hi - lo)
        target.copy_(tensor)
        covered += box.size()
    if covered != region.size():
        raise RuntimeError(f"pieces cover {covered} of the {region.size()} positions of {region.ranges}")
    return out


def _region(step: Step, worker: int, axes: tuple[int, ...]) -> Box | None:
    need = step.needed[worker]
    if need is None or not need.ranges:
        return need
    return need.clamp([step.in_shape[a] for a in axes])


def _participates(step: Step, worker: int, region: Box | None) -> bool:
    """Whether ``worker`` computes anything of ``step`` (a tiny layer may leave a worker idle)."""
    if region is None or region.empty:
        return False
    return step.kind == "owner" or (step.out_boxes[worker] is not None and not step.out_boxes[worker].empty)


def _local_input(step: Step, worker: int, region: Box, held: torch.Tensor | None,
                 received: list[tuple[Box, torch.Tensor]], batch: int, like: torch.Tensor,
                 axes: tuple[int, ...]) -> torch.Tensor:
    """``worker``'s input ``region`` of ``step``: the pieces it received plus what it holds itself."""
    pieces = list(received)
    own = step.in_boxes[worker]
    if own is not None and not region.intersect(own).empty:
        pieces.append((region.intersect(own), slice_box(held, own, region.intersect(own), axes)))
    return assemble(pieces, region, batch, step.in_shape, axes, like)


@dataclass
class LayerTraffic:
    """One layer's data movement: bytes each worker sends, and the workers each exchanges with."""

    name: str
    kind: str
    bytes_sent: list[int]
    peers: list[set[int]]
    compute_s: list[float] = field(default_factory=list)
    transfer_s: list[float] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_sent)


def plan_traffic(plan: PartitionPlan, batch: int = 1, element_size: int = 4) -> list[LayerTraffic]:
    """Bytes and peers per layer and worker, from the plan (no processes; the final gather included)."""
    rows = []
    axes = plan.spatial.axes
    for index, step in enumerate(plan.steps):
        sent = [0] * plan.workers
        peers: list[set[int]] = [set() for _ in range(plan.workers)]
        for src, dst, piece in transfers(step):
            sent[src] += _numel(batch, step.in_shape, piece, axes) * element_size
            peers[src].add(dst)
            peers[dst].add(src)
        kind = step.kind
        if index in plan.fc:
            kind = "fc:" + plan.fc[index].method
            for worker, part in enumerate(plan.fc[index].parts):
                if part.nnz:
                    sent[OWNER] += batch * part.in_cols.size * element_size
                    sent[worker + 1] += batch * part.out_rows.size * element_size
                    peers[OWNER].add(worker + 1)
                    peers[worker + 1].add(OWNER)
        rows.append(LayerTraffic(step.name, kind, sent, peers))
    last = plan.steps[-1]
    if last.spatial:  # the output is still spread over the workers: collect it on the owner
        sent = [0] * plan.workers
        peers = [set() for _ in range(plan.workers)]
        for w, box in enumerate(last.out_boxes):
            if w != OWNER and box is not None and not box.empty:
                sent[w] += _numel(batch, last.out_shape, box, axes) * element_size
                peers[w].add(OWNER)
                peers[OWNER].add(w)
        rows.append(LayerTraffic("(gather output)", "owner", sent, peers))
    return rows


def _numel(batch: int, shape: tuple[int, ...], region: Box, axes: tuple[int, ...]) -> int:
    total = batch
    for d in _piece_shape(1, shape, region, axes)[1:]:
        total *= d
    return total


# ---------------------------------------------------------------------- one process
@torch.no_grad()
def simulate(plan: PartitionPlan, x: torch.Tensor) -> torch.Tensor:
    """Run the plan for all workers in this process (same pieces, same arithmetic); the output."""
    axes, batch = plan.spatial.axes, x.shape[0]
    held: list[torch.Tensor | None] = [x if w == OWNER else None for w in range(plan.workers)]
    for index, step in enumerate(plan.steps):
        if index in plan.fc:
            held = [_fc_by_parts(plan.fc[index], step.module, held[OWNER])] + [None] * (plan.workers - 1)
            continue
        incoming: dict[int, list[tuple[Box, torch.Tensor]]] = {w: [] for w in range(plan.workers)}
        for src, dst, piece in transfers(step):
            incoming[dst].append((piece, slice_box(held[src], step.in_boxes[src], piece, axes)))
        new: list[torch.Tensor | None] = [None] * plan.workers
        for w in range(plan.workers):
            region = _region(step, w, axes)
            if not _participates(step, w, region):
                continue
            inputs = _local_input(step, w, region, held[w], incoming[w], batch, x, axes)
            new[w] = compute(step, w, inputs, axes)
        held = new
    last = plan.steps[-1]
    if not last.spatial:
        return held[OWNER]
    pieces = [(box, held[w]) for w, box in enumerate(last.out_boxes) if box is not None and not box.empty]
    return assemble(pieces, full_box(last.out_shape, axes), batch, last.out_shape, axes, x)


def _fc_by_parts(fc: FCPartition, linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``linear(x)`` summed part by part (each part: the inputs it needs times its weights)."""
    y = x.new_zeros(x.shape[0], linear.out_features)
    for party in [GO, *range(fc.workers)]:
        part = fc.part(party)
        if part.nnz:
            partial = _part_product(fc_weights(fc, linear, party).to(x.device), x[:, _index(part.in_cols, x)])
            y.index_add_(1, _index(part.out_rows, x), partial)
    return y if linear.bias is None else y + linear.bias


def _index(positions, like: torch.Tensor) -> torch.Tensor:
    """Row or column positions of an FC part as an index tensor on ``like``'s device."""
    return torch.as_tensor(positions, device=like.device)


def _part_product(weights: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """``inputs @ weights.T`` for a dense block or a CSR part (SpMV), batch first."""
    return (weights @ inputs.T).T.contiguous()


# ---------------------------------------------------------------------- torch.distributed
class DistributedExecutor:
    """Runs a plan as worker ``rank`` of ``group`` (all workers call :meth:`run` with the same batch
    shape; the owner's input is the one used; every worker gets the output). Accumulates per-layer
    bytes, peers and times in :attr:`traffic`. ``slowdown`` stretches this worker's compute (simulated
    heterogeneity). Everything travels as point-to-point messages, and workers send different numbers
    of them: give the executor a group of its own (torch's collective check counts a group's messages
    in its sequence numbers, so collectives in the same group would look desynchronised)."""

    def __init__(self, plan: PartitionPlan, rank: int, group=None, slowdown: float = 1.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.plan, self.rank, self.group = plan, rank, group
        self.slowdown, self._sleep = slowdown, sleep
        # Each fully-connected layer: the weights of this rank's part (the owner: its GO part), cut once.
        party = GO if rank == OWNER else rank - 1
        self._fc_weights = {i: fc_weights(fc, plan.steps[i].module, party).to(plan.steps[i].module.weight.device)
                            for i, fc in plan.fc.items()}
        self.traffic = [LayerTraffic(s.name, f"fc:{plan.fc[i].method}" if i in plan.fc else s.kind, [0] * plan.workers,
                                     [set() for _ in range(plan.workers)], [0.0] * plan.workers, [0.0] * plan.workers)
                        for i, s in enumerate(plan.steps)]

    def _global(self, worker: int) -> int:
        return worker if self.group is None else dist.get_global_rank(self.group, worker)

    @torch.no_grad()
    def run(self, x: torch.Tensor) -> torch.Tensor:
        """The network's output for batch ``x``, on every worker (broadcast from the owner)."""
        plan, me, axes, batch = self.plan, self.rank, self.plan.spatial.axes, x.shape[0]
        held: torch.Tensor | None = x if me == OWNER else None
        for index, step in enumerate(plan.steps):
            stats = self.traffic[index]
            if index in plan.fc:
                held = self._run_fc(index, held, batch, x)
                continue
            start = time.perf_counter()
            sends, recvs, received = [], [], []
            for src, dst, piece in transfers(step):
                if src == me:
                    data = slice_box(held, step.in_boxes[me], piece, axes)
                    sends.append((data, self._global(dst)))
                    stats.bytes_sent[me] += data.numel() * data.element_size()
                    stats.peers[me].add(dst)
                elif dst == me:
                    buffer = x.new_empty(_piece_shape(batch, step.in_shape, piece, axes))
                    recvs.append((buffer, self._global(src)))
                    received.append((piece, buffer))
                    stats.peers[me].add(src)
            exchange(sends, recvs, self.group)
            region = _region(step, me, axes)
            stats.transfer_s[me] += time.perf_counter() - start
            if _participates(step, me, region):
                inputs = _local_input(step, me, region, held, received, batch, x, axes)
                held, compute_s = self._compute(lambda: compute(step, me, inputs, axes))
                stats.compute_s[me] += compute_s
            else:
                held = None
        last = plan.steps[-1]
        out_shape = [batch, *last.out_shape]
        if last.spatial:  # collect the spread output on the owner
            pieces, sends, recvs = [], [], []
            for w, box in enumerate(last.out_boxes):
                if box is None or box.empty:
                    continue
                if w == me and me != OWNER:
                    sends.append((held, self._global(OWNER)))
                elif me == OWNER:
                    if w == OWNER:
                        pieces.append((box, held))
                    else:
                        buffer = x.new_empty(_piece_shape(batch, last.out_shape, box, axes))
                        recvs.append((buffer, self._global(w)))
                        pieces.append((box, buffer))
            exchange(sends, recvs, self.group)
            if me == OWNER:
                held = assemble(pieces, full_box(last.out_shape, axes), batch, last.out_shape, axes, x)
        result = held if me == OWNER else x.new_empty(out_shape)
        others = [self._global(w) for w in range(self.plan.workers) if w != OWNER]
        if me == OWNER:  # to every worker, as messages: the group carries no collective (see the class)
            exchange([(result, peer) for peer in others], [], self.group)
        else:
            exchange([], [(result, self._global(OWNER))], self.group)
        return result

    def _compute(self, fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float]:
        start = time.perf_counter()
        out = fn()
        stretch(time.perf_counter() - start, self.slowdown, self._sleep)
        return out, time.perf_counter() - start

    def _run_fc(self, index: int, held: torch.Tensor | None, batch: int, like: torch.Tensor) -> torch.Tensor | None:
        """A fully-connected layer shared out by its FC plan: the owner sends each worker the inputs
        its part needs and sums the partial outputs they return (plus its own part and the bias)."""
        fc, linear, stats, me = self.plan.fc[index], self.plan.steps[index].module, self.traffic[index], self.rank
        weights = self._fc_weights[index]
        start = time.perf_counter()
        if me != OWNER:
            part = fc.part(me - 1)
            if part.nnz:
                inputs = like.new_empty(batch, part.in_cols.size)
                exchange([], [(inputs, self._global(OWNER))], self.group)
                partial, compute_s = self._compute(lambda: _part_product(weights, inputs))
                exchange([(partial, self._global(OWNER))], [], self.group)
                stats.bytes_sent[me] += partial.numel() * partial.element_size()
                stats.peers[me].add(OWNER)
                stats.compute_s[me] += compute_s
                stats.transfer_s[me] += time.perf_counter() - start - compute_s
            return None
        sends, recvs, partials = [], [], []
        for worker, part in enumerate(fc.parts):
            if not part.nnz:
                continue
            inputs = held[:, _index(part.in_cols, held)]
            buffer = like.new_empty(batch, part.out_rows.size)
            sends.append((inputs, self._global(worker + 1)))
            recvs.append((buffer, self._global(worker + 1)))
            partials.append((part, buffer))
            stats.bytes_sent[me] += inputs.numel() * inputs.element_size()
            stats.peers[me].add(worker + 1)
        pending = start_exchange(sends, recvs, self.group)
        own = fc.go_part
        y, compute_s = self._compute(lambda: held.new_zeros(batch, linear.out_features).index_add_(
            1, _index(own.out_rows, held), _part_product(weights, held[:, _index(own.in_cols, held)]))
            if own.nnz else held.new_zeros(batch, linear.out_features))
        pending.wait()
        for part, buffer in partials:
            y.index_add_(1, _index(part.out_rows, y), buffer)
        stats.compute_s[me] += compute_s
        stats.transfer_s[me] += time.perf_counter() - start - compute_s
        return y if linear.bias is None else y + linear.bias
