"""Which of compute, latency or bandwidth bounds a data-parallel step, and what to pick for it.

A synchronous step (DDP) takes its compute ``C`` plus its exchange: the link's round trips ``L`` (gloo: a
round trip a message step, :func:`round_trips`; DDP's all-reduce two on 2 ranks) and its bytes over the
link's rate ``B``. A strategy that overlaps the exchange ``E`` (its round trips and bytes) with the next
``delay`` steps' compute (``delayed_averaging``, which opens enough process groups, :func:`lanes`, that all
``delay`` exchanges run at once) takes at best ``max(C, E / delay)`` a step (``max(C, B)`` where the bytes
dominate: the exchanges share the link's rate), so overlapping wins at most ``(C + L + B)`` over that. :func:`classify` names the regime by the terms, states that bound,
and says what fits:

* **compute-bound** (``C + L + B`` under :data:`WORTH` times ``C``): DDP; what the link costs is not
  worth hiding.
* **latency-bound** (``L`` at least ``B``): ``delayed_averaging`` with ``delay = ceil(E / C)``, enough
  steps of compute to cover an exchange, at most :data:`MAX_DELAY`.
* **bandwidth-bound** (``B`` the larger): fewer bytes: ``local_sgd`` with ``sync_every >= B / C`` (its
  rounds move the model once every ``sync_every`` steps).

The rules and the measurements through a real long link they rest on (``benchmarks/long_link.py``;
LeNet-5, 2 gloo ranks): docs/strategies/delayed-averaging.md, "Which regime a run is in" and "Through a real
long link"; the straggler report's reading of a link is tested on the simulator (``tests/test_straggler.py``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lightning_hybrid.comm.collectives import all_reduce_

#: A step the link lengthens by less than this factor is compute-bound.
WORTH = 1.2
#: The largest delay advised: the largest measured at DDP's samples (LeNet-5 to 98 %: 1.11x at delay 4).
MAX_DELAY = 4

#: Linux's switch for TCP's slow start after idle (RFC 2861's checks of the congestion window of a connection idle,
#: or not filling its window, for a retransmission timeout): 1, the default, lengthened the delayed all-reduce's steps.
IDLE_RESTART_SYSCTL = "/proc/sys/net/ipv4/tcp_slow_start_after_idle"

#: What restarting slow start after idle cost the delayed all-reduce's step through a 50 ms round trip, its
#: range over delays 1, 2 and 4 (benchmarks/idle_restart.py; docs/strategies/delayed-averaging.md).
IDLE_RESTART_COST = "1.02-1.64x"
#: The same through a 200 ms round trip, over every contender (DDP and delays 1, 2, 4).
IDLE_RESTART_COST_200MS = "0.99-1.04x"

#: Collectives a process group runs at once, by backend (gloo: its 2 worker threads; NCCL: one stream).
IN_FLIGHT = {"gloo": 2, "nccl": 1}


def round_trips(name: str, ranks: int, numel: int | None, backend: str = "gloo") -> float:
    """Round trips a collective ``name`` of ``ranks`` ranks over ``numel`` values takes on a long link: its
    algorithm's message steps, each a round trip under gloo (the receiver's ready notice, then the data) and
    half of one under NCCL. A ring all-reduce: ``2 (n - 1)`` steps (``n - 1`` where fewer values than ranks
    leave the reduce-scatter nothing to split); all-gather, reduce-scatter: ``n - 1``; broadcast and
    barrier: ``ceil(log2 n)`` (a tree)."""
    if ranks < 2:
        return 0.0
    if name == "all_reduce":
        steps = 2 * (ranks - 1) if numel is None or numel >= ranks else ranks - 1
    elif name in ("all_gather", "all_gather_into_tensor", "reduce_scatter_tensor"):
        steps = ranks - 1
    else:
        steps = (ranks - 1).bit_length()
    return steps * (0.5 if backend == "nccl" else 1.0)


def lanes(delay: int, backend: str) -> int:
    """Process groups an exchange ``delay`` steps deep needs so that all ``delay`` of its collectives run at
    once: ``ceil(delay / IN_FLIGHT[backend])``, at least one. Through a 50 ms round trip a 250 KB all-reduce
    took 3 round trips; one gloo group runs two at once, so a step of the delayed all-reduce could be no
    shorter than 1.5 round trips, whatever its delay, until each pair of exchanges had a group of its own."""
    return max(1, math.ceil(delay / IN_FLIGHT.get(backend, 1)))


def sent_bytes(name: str, ranks: int, nbytes: int) -> float:
    """Bytes each rank sends in collective ``name`` of a tensor of ``nbytes``: a ring all-reduce
    ``2 (n - 1) / n`` of it, an all-gather or reduce-scatter ``(n - 1) / n``, a broadcast all of it."""
    if ranks < 2:
        return 0.0
    share = {"all_reduce": 2 * (ranks - 1) / ranks, "all_gather": ranks - 1, "all_gather_into_tensor": (ranks - 1) / ranks,
             "reduce_scatter_tensor": (ranks - 1) / ranks}.get(name, 1.0)
    return share * nbytes


@dataclass(frozen=True)
class Regime:
    """A step's terms (seconds), the regime they make, the bound on overlap's gain, and the advice."""

    compute_s: float
    latency_s: float
    bandwidth_s: float
    name: str
    overlap_bound: float
    advice: str


def restarts_slow_start_after_idle(path: str = IDLE_RESTART_SYSCTL) -> bool | None:
    """Whether this host's TCP restarts slow start on an idle connection (None: not Linux, or unreadable)."""
    try:
        with open(path) as setting:
            return setting.read().strip() != "0"
    except OSError:
        return None


def classify(compute_s: float, round_trip_s: float, step_bytes: float, bytes_per_s: float, round_trips: float = 2,
             exchange_round_trips: float = 2, max_delay: int = MAX_DELAY, idle_restart: bool = False) -> Regime:
    """The regime of a step of ``compute_s`` on a link of ``round_trip_s`` and ``bytes_per_s`` moving
    ``step_bytes`` a step (module docstring). ``round_trips``: what a synchronous step waits for (DDP on
    2 gloo ranks: its all-reduce's 2; 3 where the ranks also agree on a stop before every batch);
    ``exchange_round_trips``: one overlapped exchange's (an all-reduce: 2). ``idle_restart``: the host restarts
    TCP's slow start after idle (:func:`restarts_slow_start_after_idle`): the latency-bound advice says to stop it."""
    if compute_s <= 0 or round_trip_s < 0 or round_trips < 0 or step_bytes < 0 or bytes_per_s <= 0 or max_delay < 1:
        raise ValueError(f"a step's terms are positive (compute {compute_s}, round trip {round_trip_s} x {round_trips}, "
                         f"{step_bytes} bytes at {bytes_per_s} B/s, delay up to {max_delay})")
    latency, bandwidth = round_trip_s * round_trips, step_bytes / bytes_per_s
    exchange = round_trip_s * exchange_round_trips + bandwidth
    delay = min(max_delay, max(1, math.ceil(exchange / compute_s - 1e-9)))
    # lanes run the exchanges at once, but where the bytes dominate the link's rate is shared by them all
    floor = max(compute_s, exchange / delay, bandwidth if bandwidth > latency else 0.0)
    bound = (compute_s + latency + bandwidth) / floor
    if compute_s * WORTH >= compute_s + latency + bandwidth:
        return Regime(compute_s, latency, bandwidth, "compute-bound", bound,
                      f"strategy=ddp: the link adds {(latency + bandwidth) / compute_s:.0%} to a step; overlapping it "
                      f"could win at most {bound:.2f}x")
    if latency >= bandwidth:
        exposed = "" if floor == compute_s else f" ({1000 * (floor - compute_s):.0f} ms a step still exposed)"
        tcp = ("; and set net.ipv4.tcp_slow_start_after_idle=0 on every host (sysctl -w, as root): this host keeps "
               f"Linux's default, 1, which made the delayed all-reduce's steps {IDLE_RESTART_COST} longer through a "
               f"50 ms round trip (delays 1, 2, 4; {IDLE_RESTART_COST_200MS} at 200 ms)") if idle_restart else ""
        return Regime(compute_s, latency, bandwidth, "latency-bound", bound,
                      f"strategy=delayed_averaging strategy.delay={delay}: {delay} steps of compute overlap an exchange's "
                      f"{1000 * exchange:.0f} ms{exposed}; overlapping wins at most {bound:.2f}x{tcp}")
    rounds = max(2, math.ceil(bandwidth / compute_s))
    return Regime(compute_s, latency, bandwidth, "bandwidth-bound", bound,
                  f"strategy=local_sgd strategy.sync_every={rounds} or more: the link moves a step's "
                  f"{step_bytes / 1e6:.2f} MB in {1000 * bandwidth:.0f} ms, which overlap cannot shorten "
                  f"(at most {bound:.2f}x); fewer exchanges can")


def measure_link(numel: int, device: torch.device | str = "cpu", repeats: int = 3) -> tuple[float, float]:
    """The link between this process group's ranks, measured with its own collectives (every rank calls it):
    the round trip (a one-value all-reduce, one message step: the median of ``repeats``) and the rate in
    bytes a second of an all-reduce of ``numel`` float32 values, its round trips taken off (``inf`` where
    they take all of its time)."""
    ranks = dist.get_world_size()

    def timed(tensor: torch.Tensor) -> float:
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            all_reduce_(tensor)
            times.append(time.perf_counter() - start)
        return sorted(times)[len(times) // 2]

    round_trip = timed(torch.zeros(1, device=device)) / max(round_trips("all_reduce", ranks, 1), 1)
    full = timed(torch.zeros(max(numel, ranks), device=device))
    moved = sent_bytes("all_reduce", ranks, 4 * max(numel, ranks))
    left = full - round_trip * round_trips("all_reduce", ranks, numel)
    return round_trip, (moved / left if left > 1e-4 else float("inf"))
