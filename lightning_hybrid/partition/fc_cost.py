"""The cost model of a sparse fully-connected layer shared among workers (MoDNN section 5), and its records.

Parties: the workers ``0 .. k-1`` and the group owner :data:`GO`, which holds the layer's input,
sends each worker the inputs its part needs and sums the partial outputs they return. What a plan
costs per inference (the paper gives the terms, not the units; these are ours):

* compute, in *dense multiply-accumulates* (MACs): a part with ``nnz`` nonzeros spanning
  ``n_rows`` rows and ``n_cols`` columns is computed with SpMV when its density
  ``nnz / (n_rows * n_cols)`` is below the density threshold ``d* = 1 - sparsity_threshold``, else
  with GEMV on its ``n_rows x n_cols`` sub-block. GEMV costs ``n_rows * n_cols`` MACs and SpMV
  ``nnz / d*`` (the threshold is where the two take equal time, so SpMV's cost per nonzero is
  ``1 / d*`` dense MACs: 6.3 with the paper's 15.8%). Hence ``compute = min(nnz / d*, n_rows * n_cols)``
  (:func:`compute_cost`), linear in the work as the paper measured (section 7.1);
* abilities (``CA[i]``) are in units of ``ability_unit`` dense MACs per second (default
  :data:`ABILITY_UNIT`, 1e9: an ability of 1.0 is 1 GMAC/s; :func:`lightning_hybrid.devices.macs_per_unit`
  gives the unit for abilities in FLOP/s or relative to another reference); compute time =
  compute / (ability * ability_unit) (:func:`compute_seconds`);
* transfer time of a worker = (inputs received + partial outputs sent) * ``element_size`` /
  ``throughput`` + ``wakeup_s`` (one wake-up per worker per layer, nothing for an idle worker);
  defaults are the paper's WLAN measurements, 43.8 Mbit/s and 54.7 ms (section 7.1)
  (:func:`transfer_seconds`);
* ``ET[i]`` = compute time + transfer time; the GO's ``ET_GO`` = its compute time (its sending
  and summing are not modelled, as in the paper).

:class:`LayerCost` records what one partitioned layer costs per worker, and
:func:`format_cost_table` puts several side by side. The plans themselves are in
:mod:`~lightning_hybrid.partition.fc_partition`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from lightning_hybrid.devices import REFERENCE_ABILITY_FLOPS, macs_per_unit
from lightning_hybrid.partition.sparsity import PAPER_SPARSITY_THRESHOLD

GO = -1
"""The group owner's index in owners and peer lists (workers are ``0 .. k-1``)."""

DEFAULT_THROUGHPUT = 43.8e6 / 8
"""Bytes per second: MoDNN's measured WLAN throughput, 43.8 Mbit/s (section 7.1)."""

DEFAULT_WAKEUP_S = 54.7e-3
"""Seconds: MoDNN's measured WLAN wake-up time (section 7.1)."""

ABILITY_UNIT = macs_per_unit("relative", REFERENCE_ABILITY_FLOPS)
"""Dense multiply-accumulates per second per unit of ability (an ability of 1.0 is 1 GMAC/s)."""


# --------------------------------------------------------------------------------------------------
# Accounting shared by the layer partitions (FC here; conv partitions can produce the same record)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerCost:
    """What one partitioned layer costs per inference, per worker.

    Args:
        layer: the layer's name (``"fc6"``).
        method: the partition scheme (``"rows"``, ``"mscc+fgcp"``, ``"bodp"``, ``"grid"``...).
        bytes_per_worker: bytes each worker exchanges per inference (received plus sent).
        peers: for each worker, the parties it exchanges data with (:data:`GO` or worker indices).
        compute_s: each worker's estimated compute seconds.
        transfer_s: each worker's estimated data-delivery seconds (transmission plus wake-up).
        go_compute_s: the GO's estimated compute seconds for the part it keeps.

    Example::

        >>> c = LayerCost("fc8", "rows", (400, 600), ((GO,), (GO,)), (0.01, 0.02), (0.06, 0.06))
        >>> c.total_bytes, c.max_peers, round(c.makespan_s, 3)
        (1000, 1, 0.08)
    """

    layer: str
    method: str
    bytes_per_worker: tuple[int, ...]
    peers: tuple[tuple[int, ...], ...]
    compute_s: tuple[float, ...]
    transfer_s: tuple[float, ...]
    go_compute_s: float = 0.0

    @property
    def workers(self) -> int:
        return len(self.bytes_per_worker)

    @property
    def total_bytes(self) -> int:
        return int(sum(self.bytes_per_worker))

    @property
    def max_peers(self) -> int:
        return max((len(p) for p in self.peers), default=0)

    @property
    def estimated_s(self) -> tuple[float, ...]:
        """Each worker's estimated time ``ET[i]`` (compute plus transfer)."""
        return tuple(c + t for c, t in zip(self.compute_s, self.transfer_s))

    @property
    def makespan_s(self) -> float:
        """The layer's estimated time: the slowest worker, or the GO if it is slower."""
        return max(max(self.estimated_s, default=0.0), self.go_compute_s)

    def reduction_vs(self, baseline: LayerCost) -> float:
        """Fraction of ``baseline``'s total bytes this plan saves (negative if it sends more)."""
        return 1.0 - self.total_bytes / baseline.total_bytes if baseline.total_bytes else 0.0

    def as_dict(self) -> dict:
        return {
            "layer": self.layer, "method": self.method, "workers": self.workers,
            "total_bytes": self.total_bytes, "bytes_per_worker": list(self.bytes_per_worker),
            "peers": [list(p) for p in self.peers], "max_peers": self.max_peers,
            "compute_s": list(self.compute_s), "transfer_s": list(self.transfer_s),
            "go_compute_s": self.go_compute_s, "makespan_s": self.makespan_s,
        }


def format_cost_table(costs: Sequence[LayerCost], baseline_method: str | None = None) -> str:
    """A markdown table of layer costs, one row each; with ``baseline_method``, each row's byte
    reduction against the row of that method for the same layer and worker count.

    Example::

        >>> a = LayerCost("fc8", "rows", (600, 600), ((GO,), (GO,)), (0.0, 0.0), (0.1, 0.1))
        >>> b = LayerCost("fc8", "mscc+fgcp", (300, 300), ((GO,), (GO,)), (0.0, 0.0), (0.1, 0.1))
        >>> print(format_cost_table([a, b], baseline_method="rows").splitlines()[-1])
        | fc8 | mscc+fgcp | 2 | 600 | 300 / 300 | 1 | 100.0 | 0.0 | 50.0% |
    """
    header = "| layer | method | workers | total bytes | bytes per worker | max peers | est. ms | GO ms |"
    rule = "|---|---|---|---|---|---|---|---|"
    if baseline_method:
        header += f" reduction vs {baseline_method} |"
        rule += "---|"
    base = {(c.layer, c.workers): c for c in costs if c.method == baseline_method}
    lines = [header, rule]
    for c in costs:
        line = (
            f"| {c.layer} | {c.method} | {c.workers} | {c.total_bytes} | "
            f"{' / '.join(str(b) for b in c.bytes_per_worker)} | {c.max_peers} | "
            f"{1e3 * c.makespan_s:.1f} | {1e3 * c.go_compute_s:.1f} |"
        )
        if baseline_method:
            ref = base.get((c.layer, c.workers))
            line += f" {100 * c.reduction_vs(ref):.1f}% |" if ref else " |"
        lines.append(line)
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Cost model
# --------------------------------------------------------------------------------------------------


def compute_cost(nnz: int, n_rows: int, n_cols: int, sparsity_threshold: float = PAPER_SPARSITY_THRESHOLD) -> float:
    """Dense-MAC cost of a part: ``min(nnz / d*, n_rows * n_cols)`` with ``d* = 1 - sparsity_threshold``.

    The first term is SpMV (used when the part is sparser than the threshold), the second GEMV.

    Example::

        >>> compute_cost(100, 10, 100, sparsity_threshold=0.75)  # density 0.1 < 0.25: SpMV, 4 MACs/nonzero
        400.0
        >>> compute_cost(600, 10, 100, sparsity_threshold=0.75)  # density 0.6: GEMV on the 10 x 100 block
        1000.0
    """
    if nnz <= 0:
        return 0.0
    dense = float(n_rows) * float(n_cols)
    density_threshold = 1.0 - sparsity_threshold
    if density_threshold <= 0.0:
        return dense
    return min(nnz / density_threshold, dense)


def compute_format(nnz: int, n_rows: int, n_cols: int, sparsity_threshold: float = PAPER_SPARSITY_THRESHOLD) -> str:
    """``"spmv"`` if the part is sparser than ``sparsity_threshold`` (fraction of zeros), else ``"gemv"``
    (``"none"`` for an empty part).

    Example::

        >>> compute_format(100, 10, 100, 0.842), compute_format(600, 10, 100, 0.842)
        ('spmv', 'gemv')
    """
    if nnz <= 0:
        return "none"
    return "spmv" if nnz < (1.0 - sparsity_threshold) * float(n_rows) * float(n_cols) else "gemv"


def compute_seconds(macs: float, ability: float, ability_unit: float = ABILITY_UNIT) -> float:
    """Seconds a party of ``ability`` (``ability * ability_unit`` MAC/s) takes for ``macs`` dense MACs:
    0 without work, ``inf`` with work and no ability (a GO of ability 0 computes nothing).

    Example::

        >>> compute_seconds(2e9, 4.0), compute_seconds(0.0, 0.0), compute_seconds(1.0, 0.0)
        (0.5, 0.0, inf)
    """
    if macs == 0:
        return 0.0
    return macs / (ability * ability_unit) if ability > 0 else math.inf


def transfer_seconds(n_bytes: float, throughput: float = DEFAULT_THROUGHPUT, wakeup_s: float = DEFAULT_WAKEUP_S) -> float:
    """Seconds a worker takes to exchange ``n_bytes`` with the GO: ``n_bytes / throughput`` plus one
    wake-up (nothing for a worker that exchanges nothing).

    Example::

        >>> transfer_seconds(1000, throughput=1e4, wakeup_s=0.05), transfer_seconds(0)
        (0.15000000000000002, 0.0)
    """
    return n_bytes / throughput + (wakeup_s if n_bytes else 0.0)


def check_abilities(abilities: Sequence[float], workers: int | None) -> tuple[float, ...]:
    """The workers' abilities as floats, or a ValueError saying what is wrong (type, count, sign)."""
    try:
        values = tuple(float(a) for a in abilities)
    except TypeError as err:
        raise ValueError(f"abilities must be a sequence of positive numbers, got {abilities!r}") from err
    if not values:
        raise ValueError("abilities is empty: give one computing ability per worker")
    if workers is not None and len(values) != workers:
        raise ValueError(f"got {len(values)} abilities for {workers} workers: give exactly one per worker")
    bad = [a for a in values if not (a > 0 and math.isfinite(a))]
    if bad:
        raise ValueError(f"abilities must be positive and finite, got {list(values)}")
    return values


def check_model(go_ability: float, throughput: float, wakeup_s: float, sparsity_threshold: float, element_size: int) -> None:
    """A ValueError naming the first cost-model argument out of range, if any."""
    if not (go_ability >= 0 and math.isfinite(go_ability)):
        raise ValueError(f"go_ability must be >= 0 (0: the GO computes nothing), got {go_ability}")
    if not (throughput > 0):
        raise ValueError(f"throughput must be positive (bytes/s), got {throughput}")
    if not (wakeup_s >= 0):
        raise ValueError(f"wakeup_s must be >= 0, got {wakeup_s}")
    if not (0.0 <= sparsity_threshold <= 1.0):
        raise ValueError(f"sparsity_threshold is a fraction of zeros in [0, 1], got {sparsity_threshold}")
    if element_size < 1:
        raise ValueError(f"element_size must be a positive number of bytes, got {element_size}")
