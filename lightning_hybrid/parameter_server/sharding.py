"""Sharded parameter servers: the parameters split into ``k`` contiguous shards, one server process each.

One server process spends, per push, what a push of the whole model costs: the gradient in, the
optimizer's step, the parameters out (:mod:`~lightning_hybrid.parameter_server.load` measures it).
``k`` servers each take a contiguous run of the optimizer's parameter tensors, balanced by bytes
(:func:`plan_shards`), with the user's optimizer over those tensors only (:func:`shard_optimizer`):
a worker's push goes to all of them at once, each its slice, and each answers with its slice of
the parameters (:class:`ShardedClient`), so the per-value work of a push is split ``k`` ways and
runs on ``k`` cores. Only shard 0 deals the data.

What the shards agree on, and what they do not (as in ps-lite and BytePS, where each server
applies the pushes of its own keys as they arrive):

* Every shard receives every push, and applies the same update rule with the same settings, so
  each takes one optimizer step per ``pushes_per_update`` pushes and stops after exactly
  ``max_steps`` steps: the step counts agree. ``global_step`` is shard 0's.
* The staleness bound holds on every shard: a worker goes on when every shard has let it.
* With staleness 0 each round is the mean of the same gradients on every shard: the same step as
  one server (and as DDP). With staleness > 0 the pushes of different workers may reach two shards
  in different orders; then two shards' step ``t`` may average different pushes, each applied in
  full to its own parameters, and the staleness each measures (for the staleness-weighted average
  and the momentum correction) is its own. A worker's replies then hold parameters of the same
  step count from each shard.

Lightning's gradient clipping (``gradient_clip_val``) spans the shards: a norm clip of a step's average
takes the whole gradient's norm, each shard's part of it meeting the others' on the run's store
(:mod:`~lightning_hybrid.parameter_server.average_clip`). Optimizers whose step couples parameters across
tensors (a global gradient-norm clip inside the optimizer's own step, LBFGS) would see each shard's part
only; SGD, Adam and the other per-tensor optimizers of ``torch.optim`` are exact.

Example::

    >>> plan = plan_shards([6, 2, 2, 6], 2)
    >>> plan.tensors, plan.values
    ([(0, 2), (2, 4)], [(0, 8), (8, 16)])
"""

from __future__ import annotations

import copy
import functools
import operator
import os
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lightning_hybrid.parameter_server.channel import Bulk
from lightning_hybrid.parameter_server.client import ParameterServerClient, PullInfo
from lightning_hybrid.comm.clipping import Clip
from lightning_hybrid.parameter_server.hyperparameters import GroupValues
from lightning_hybrid.parameter_server.load import ServerLoad
from lightning_hybrid.parameter_server.protocol import DatasetShape

#: ``servers="auto"``: a second server only for models of at least this many parameters (below it
#: a push's per-message cost, which every shard pays again, outweighs the per-value work split).
AUTO_MIN_PARAMS_PER_SHARD = 4_000_000


@dataclass(frozen=True)
class ShardPlan:
    """Shard ``i`` holds the optimizer's parameter tensors ``tensors[i] = (first, end)`` (in the
    order of its param groups), which are the values ``values[i] = (start, stop)`` of the flat vector."""

    tensors: list[tuple[int, int]]
    values: list[tuple[int, int]]

    @property
    def shards(self) -> int:
        return len(self.tensors)


def plan_shards(sizes: Sequence[int], shards: int) -> ShardPlan:
    """Split tensors of ``sizes`` values into ``shards`` contiguous runs of about equal bytes: each
    boundary at the tensor edge nearest its share of the total, each shard at least one tensor (a
    ValueError if there are fewer tensors than shards)."""
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ValueError(f"servers must be a positive integer or 'auto', got {shards!r}")
    if len(sizes) < shards:
        raise ValueError(f"{shards} server shards need at least {shards} parameter tensors; the optimizer holds {len(sizes)}")
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + size)
    edges = [0]
    for j in range(1, shards):
        target = starts[-1] * j / shards
        candidates = range(edges[-1] + 1, len(sizes) - (shards - j) + 1)
        edges.append(min(candidates, key=lambda edge: abs(starts[edge] - target)))
    edges.append(len(sizes))
    tensors = [(edges[i], edges[i + 1]) for i in range(shards)]
    return ShardPlan(tensors, [(starts[a], starts[b]) for a, b in tensors])


def auto_servers(num_params: int, workers_on_host: int, cores: int | None = None) -> int:
    """``servers="auto"``: one shard per :data:`AUTO_MIN_PARAMS_PER_SHARD` parameters, no more than
    the cores the workers on this host leave free, or two (at least one server). Two even without a
    free core: the workers mostly wait for the server while it works on a large model, and two
    shards use both of two cores then (3D-ResAttNet-18 on 2 CPU workers and 2 cores: 1.02x DDP's
    samples per second with two shards, 0.81-0.88x with one; ``benchmarks/README.md``)."""
    cores = cores if cores is not None else len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    by_size = num_params // AUTO_MIN_PARAMS_PER_SHARD
    return max(1, min(by_size, max(cores - workers_on_host, 2)))


def shard_optimizer(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> torch.optim.Optimizer:
    """A copy of ``optimizer`` (its class, hyperparameters and state) over ``params`` only: every
    param group is kept, with those of its parameters that are in ``params`` (possibly none), so
    that the hyperparameters a push brings, group by group, still apply."""
    keep = {id(p) for p in params}
    shard = copy.copy(optimizer)
    shard.param_groups = [{**group, "params": [p for p in group["params"] if id(p) in keep]} for group in optimizer.param_groups]
    shard.state = defaultdict(dict, {p: s for p, s in optimizer.state.items() if id(p) in keep})
    return shard


def merge_states(states: Sequence[dict[str, Any]], plan: ShardPlan) -> dict[str, Any]:
    """The state dict of the whole optimizer from its shards' (``states[i]`` of shard ``i``): each
    shard numbers its parameters from 0, the whole optimizer in the order of the plan."""
    merged_state: dict[int, Any] = {}
    groups = [dict(group, params=[]) for group in states[0]["param_groups"]]
    for (first, _), state in zip(plan.tensors, states):
        local = [index for group in state["param_groups"] for index in group["params"]]
        renumber = {index: first + k for k, index in enumerate(sorted(local))}
        for index, value in state["state"].items():
            merged_state[renumber[index]] = value
        for merged, group in zip(groups, state["param_groups"]):
            merged["params"].extend(renumber[index] for index in group["params"])
    for group in groups:
        group["params"].sort()
    return {"state": merged_state, "param_groups": groups}


class ShardedClient:
    """A worker's end of ``k`` server shards, with :class:`ParameterServerClient`'s interface:
    ``clients[i]`` talks to shard ``i``, which holds the slice ``plan.values[i]`` of the flat vectors."""

    def __init__(self, clients: Sequence[ParameterServerClient], plan: ShardPlan) -> None:
        if len(clients) != plan.shards:
            raise ValueError(f"{plan.shards} shards planned, {len(clients)} clients given")
        self.clients, self.plan = list(clients), plan
        self.worker = clients[0].worker
        #: After :meth:`shutdown`: each shard's load.
        self.shard_loads: list[ServerLoad] = []
        # the shards' versions in each reply, by shard 0's (the version the strategy sees), for read_version
        self._versions: OrderedDict[int, list[int]] = OrderedDict()

    def _slices(self, bulk: Bulk) -> list[Bulk]:
        """Each shard's part of a flat vector, or of the model's tensors."""
        if isinstance(bulk, torch.Tensor):
            return [bulk[start:stop] for start, stop in self.plan.values]
        return [list(bulk[first:end]) for first, end in self.plan.tensors]

    def attach_shared_memory(self, num_params: int) -> str:
        """Each shard's segment (see :meth:`ParameterServerClient.attach_shared_memory`):
        ``"shared_memory"`` when every shard has one, else ``"channel"`` (for the others)."""
        used = {c.attach_shared_memory(stop - start) for c, (start, stop) in zip(self.clients, self.plan.values)}
        return "shared_memory" if used == {"shared_memory"} else "channel"

    def init(self, optimizer: torch.optim.Optimizer) -> int:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        return sum(client.init(shard_optimizer(optimizer, params[first:end]))
                   for client, (first, end) in zip(self.clients, self.plan.tensors))

    def next_chunk(self, epoch: int, dataset: DatasetShape) -> tuple[torch.Tensor, int] | None:
        return self.clients[0].next_chunk(epoch, dataset)  # shard 0 deals the data

    def _merge(self, infos: list[PullInfo]) -> PullInfo:
        first = infos[0]
        self._versions[first.version] = [info.version for info in infos]
        while len(self._versions) > 64:
            self._versions.popitem(last=False)
        return PullInfo(
            first.version, max(i.staleness for i in infos), max(i.gap for i in infos), max(i.max_gap for i in infos),
            first.global_syncs, first.chunk, first.chunk_segment, first.epoch_over, any(i.stop for i in infos),
            first.stopped_inside_epoch, _and(i.live for i in infos), first.adopt,
        )

    def push(self, flat_grad: Bulk, hyperparameters: Sequence[float] | GroupValues, out: Bulk,
             next_chunk_of_epoch: int | None = None, weight: int = 1, read_version: int | None = None, batches: int = 1,
             shares: int = 0, has_gradient: torch.Tensor | None = None, clip: Clip | None = None) -> PullInfo:
        """Push each shard its slice of ``flat_grad`` (and of the per-tensor ``has_gradient``), with every
        group's ``hyperparameters`` and the ``clip``, all before waiting for any (they work at once: a shard
        waiting for the others' part of a clipped step's norm gets it); each shard's slice of the newest
        parameters into ``out``."""
        reads = self._versions.get(read_version) if read_version is not None else None
        outs, grads = self._slices(out), self._slices(flat_grad)
        masks = [None if has_gradient is None else has_gradient[first:end] for first, end in self.plan.tensors]
        sent = [
            client.send_push(grad, hyperparameters, part, next_chunk_of_epoch if i == 0 else None, weight,
                             None if reads is None else reads[i], batches, shares, mask, clip)
            for i, (client, grad, part, mask) in enumerate(zip(self.clients, grads, outs, masks))
        ]
        return self._merge(self._pulled_from_all(sent, outs))

    def _pulled_from_all(self, sent: list, outs: list[Bulk]) -> list[PullInfo]:
        """Every shard's reply, each awaited at once (a thread a shard beyond the first): a shard sends its reply
        when its peers' part of a clipped step's norm arrives, and its send waits for this worker's receive,
        so waiting for the shards one after another can wait for a shard that waits for another worker that
        waits for a shard this worker has not yet listened to (tests/parameter_server/test_step_settings.py, 2 shards)."""
        infos: list[PullInfo | None] = [None] * len(self.clients)
        errors: list[BaseException] = []

        def pull(i: int) -> None:
            try:
                infos[i] = self.clients[i].pulled(sent[i], outs[i])
            except BaseException as error:  # noqa: BLE001 (re-raised below, in the caller's thread)
                errors.append(error)

        threads = [threading.Thread(target=pull, args=(i,), name=f"ps-shard-{i}-reply", daemon=True)
                   for i in range(1, len(self.clients))]
        for thread in threads:
            thread.start()
        pull(0)
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return infos  # type: ignore[return-value]

    def finish(self, out: torch.Tensor) -> PullInfo:
        outs = self._slices(out)
        sent = [client.send_finish(part) for client, part in zip(self.clients, outs)]
        return self._merge(self._pulled_from_all(sent, outs))

    def optimizer_state(self) -> dict[str, Any]:
        return merge_states([client.optimizer_state() for client in self.clients], self.plan)

    @property
    def on_run_stopped(self) -> Callable[[int], None]:
        return self.clients[0].on_run_stopped

    @on_run_stopped.setter
    def on_run_stopped(self, handler: Callable[[int], None]) -> None:
        for client in self.clients:
            client.on_run_stopped = handler

    def stop_run(self, signum: int) -> None:
        for client in self.clients:
            client.stop_run(signum)

    def leave(self) -> None:
        for client in self.clients:
            client.leave()

    def shutdown(self) -> ServerLoad:
        """End every shard; their loads together (:meth:`ServerLoad.combined`), each in :attr:`shard_loads`."""
        self.shard_loads = [client.shutdown() for client in self.clients]
        return ServerLoad.combined(self.shard_loads)


def _and(masks) -> int:
    return functools.reduce(operator.and_, masks, -1)
