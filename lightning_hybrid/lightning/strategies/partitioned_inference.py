# Generated from lightning_hybrid/strategies/partitioned_inference.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""PartitionedInferenceStrategy: one input split across heterogeneous devices (MoDNN, paper 001).

The algorithms live in :mod:`lightning_hybrid.partition`; this module wires them into Lightning:
every rank sees the same batches, the module's block sequence (``pipeline_blocks()``) is routed
through a :class:`~lightning_hybrid.partition.spatial_executor.DistributedExecutor` during predict,
validate and test, and the per-layer accounting is gathered when a loop ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_hybrid.comm.collectives import all_gather_object
from lightning_hybrid.devices import REFERENCE_ABILITY_FLOPS, macs_per_unit, positive_per_device, probe_speed
from lightning_hybrid.partition.spatial_executor import DistributedExecutor, LayerTraffic
from lightning_hybrid.partition.network import FC_PARTITIONS, PartitionPlan, plan_partition
from lightning_hybrid.partition.spatial import CONV_PARTITIONS, SPATIAL_LAYERS, PartitionError
from lightning_hybrid.pipeline.module_contract import pipeline_blocks
from lightning_hybrid.lightning.strategies.checked_ddp import CheckedDDPStrategy
from lightning_hybrid.strategies.routed_evaluation import routed_steps

log = logging.getLogger(__name__)


def check_abilities(abilities: Sequence[float] | None, workers: int | None = None) -> list[float] | None:
    """The abilities as floats, or a ValueError saying what is wrong (count, sign)."""
    if abilities is None:
        return None
    return positive_per_device(
        abilities, "abilities", workers, per="worker", instead=" (trainer devices x nodes), or abilities=None to measure them"
    )


class PartitionedInferenceStrategy(CheckedDDPStrategy):
    """Inference with every input split across the workers in proportion to their computing ability.

    Convolutional layers are split along the input's longest spatial axis (``conv_partition="bodp"``,
    MoDNN's Biased One-Dimensional Partition; 2-D images and 3-D volumes) or on an even 2-D grid
    (``"grid2d"``, the conventional baseline); workers exchange only the halo rows their neighbours
    own, pooling, normalization and activation layers run on each worker's slice, and spatially local
    blocks (residual blocks) run on the slice plus the overlap they need. Fully-connected layers run
    on the group owner (rank 0), their weights shared with the other workers by
    ``fc_partition="mscc_fgcp"`` (spectral co-clustering + fine-grain cross partition; dense layers
    fall back to rows) or ``"rows"`` (the 1-D baseline), or kept whole (``"owner"``). Layers that are
    not spatially local (self-attention, global pooling, flatten) run on the group owner: it gathers
    the tensor, runs the layer and scatters the result again if local layers follow. Every rank
    returns the same predictions.

    Args:
        abilities: one computing ability per worker, relative speeds (the FC cost model takes an
            ability of 1 as 1 GMAC/s, :data:`~lightning_hybrid.devices.REFERENCE_ABILITY_FLOPS`), or
            ``None`` to measure each rank's FLOP/s with a matrix-product probe when inference starts
            (see :mod:`lightning_hybrid.devices`).
        conv_partition: ``"bodp"`` or ``"grid2d"``.
        fc_partition: ``"mscc_fgcp"``, ``"rows"`` or ``"owner"``.
        min_sparsity: a fully-connected layer with fewer zeros than this is split by rows.
        process_group_backend: ``None``: nccl with one process per GPU, otherwise gloo.
        processes_per_device: processes started on each device the Trainer gives (``devices=1,
            processes_per_device=2``: two processes on one GPU, whose group then uses gloo).

    After a loop, :attr:`traffic` holds one :class:`~lightning_hybrid.partition.spatial_executor.LayerTraffic`
    per layer (bytes each worker sent, its peers, compute and transfer seconds, summed over batches)
    and :attr:`plan` the partition; a table is logged.

    Not for training (``fit`` is refused: train with another strategy, then load the checkpoint).

    Examples:
        >>> import lightning.pytorch as pl
        >>> from lightning_hybrid import PartitionedInferenceStrategy
        >>> strategy = PartitionedInferenceStrategy(abilities=[1.0, 2.0], conv_partition="bodp")
        >>> trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False)
        >>> trainer.strategy.abilities
        [1.0, 2.0]
        >>> # predictions = trainer.predict(model, dataloaders=loader)   or strategy="partitioned_inference"
    """

    wraps_model = False  # no DDP wrapper (CheckedDDPStrategy.wraps_model)
    #: evaluation runs the module's blocks through :meth:`routed_forward` (composition: routed_evaluation)
    validation_step, test_step, predict_step = routed_steps(CheckedDDPStrategy)

    strategy_name = "partitioned_inference"
    process_role = "partition process"
    aliases = {
        "partitioned_inference": ("MoDNN partitioned inference: BODP convolutions, MSCC+FGCP FC layers", {}),
    }

    def __init__(
        self,
        abilities: Sequence[float] | None = None,
        conv_partition: str = "bodp",
        fc_partition: str = "mscc_fgcp",
        min_sparsity: float = 0.5,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if conv_partition not in CONV_PARTITIONS:
            raise ValueError(f"unknown conv_partition {conv_partition!r}; choose one of {CONV_PARTITIONS}")
        if fc_partition not in FC_PARTITIONS:
            raise ValueError(f"unknown fc_partition {fc_partition!r}; choose one of {FC_PARTITIONS}")
        self.abilities = check_abilities(abilities)
        self.conv_partition = conv_partition
        self.fc_partition = fc_partition
        self.min_sparsity = float(min_sparsity)
        self.compute_slowdown = 1.0
        self.plan: PartitionPlan | None = None
        self.traffic: list[LayerTraffic] = []
        self._executors: dict[tuple[int, ...], DistributedExecutor] = {}
        self._messages: dist.ProcessGroup | None = None

    # ------------------------------------------------------------------ checks
    @property
    def num_workers(self) -> int:
        return self.num_nodes * self.num_processes

    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        """Fitting is refused (called before other processes start)."""
        raise ValueError(
            "PartitionedInferenceStrategy runs inference only (trainer.predict, validate, test). Train with "
            "another strategy (e.g. 'ddp'), then predict with this one from the checkpoint."
        )

    def check_evaluation(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        """Refuse bad abilities or a module without a block sequence, before other processes start."""
        if self.num_workers < 2:
            raise ValueError(f"PartitionedInferenceStrategy needs at least two workers (devices), got {self.num_workers}")
        check_abilities(self.abilities, self.num_workers)
        if model is not None:
            try:
                blocks = pipeline_blocks(model)
            except TypeError as err:
                raise TypeError(f"PartitionedInferenceStrategy partitions the module's block sequence: {err}") from None
            if not any(isinstance(m, SPATIAL_LAYERS) for m in blocks.modules()):
                raise ValueError(
                    f"PartitionedInferenceStrategy splits convolution and pooling layers over the input's spatial axes "
                    f"(MoDNN); {type(model).__name__}'s block sequence has none, so one rank would compute everything. "
                    "Run its inference with strategy='ddp' (or on one device) instead."
                )

    slows_its_compute = True  # Capabilities: a simulated straggler slows the compute itself

    def inject_compute_slowdown(self, factor: float) -> None:
        """Make this rank's layer compute ``factor`` times slower (heterogeneity simulation)."""
        if not factor >= 1.0:
            raise ValueError(f"compute slowdown must be >= 1, got {factor}")
        self.compute_slowdown = float(factor)
        for executor in self._executors.values():
            executor.slowdown = self.compute_slowdown

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        """Every rank reads the same batches: each works on a part of every input."""
        return {"num_replicas": 1, "rank": 0}

    def setup(self, trainer: pl.Trainer) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            self.check_trainer(trainer, self.lightning_module)
        self.check_evaluation(trainer, self.lightning_module)
        super().setup(trainer)
        if self._messages is None and self.world_size > 1:  # the executors' messages: a group of their own
            self._messages = dist.new_group(backend=self._get_process_group_backend())

    # ------------------------------------------------------------------ planning
    def _measured_abilities(self) -> list[float]:
        """Every rank's FLOP/s (slowed as its layer compute is)."""
        speeds = all_gather_object(probe_speed(self.root_device, slowdown=self.compute_slowdown))
        return [float(s) for s in speeds]

    def _executor(self, sample_shape: tuple[int, ...]) -> DistributedExecutor:
        executor = self._executors.get(sample_shape)
        if executor is not None:
            return executor
        probed = self.abilities is None
        abilities = self._measured_abilities() if probed else self.abilities
        ability_unit = macs_per_unit("flop/s" if probed else "relative", REFERENCE_ABILITY_FLOPS)
        net = pipeline_blocks(self.lightning_module)
        try:
            plan = plan_partition(net, sample_shape, abilities, self.conv_partition, self.fc_partition, self.min_sparsity,
                                  ability_unit=ability_unit)
        except PartitionError as err:
            raise ValueError(f"PartitionedInferenceStrategy: {err}") from None
        signature = [[(s.kind, s.out_boxes) for s in plan.steps], {i: fc.owner.tolist() for i, fc in plan.fc.items()}]
        signatures = all_gather_object(signature)
        if any(s != signatures[0] for s in signatures):
            raise RuntimeError("the ranks planned different partitions of the same network; run them on identical software")
        self.plan = plan
        for step in plan.steps:  # what runs on the group owner instead, and why
            if step.note and not step.note.startswith("follows "):
                rank_zero_info(f"PartitionedInferenceStrategy: layer {step.name}: {step.note}")
        for index, note in plan.fc_notes.items():
            rank_zero_info(f"PartitionedInferenceStrategy: layer {plan.steps[index].name}: {note}")
        executor = DistributedExecutor(plan, self.global_rank, group=self._messages, slowdown=self.compute_slowdown)
        self._executors[sample_shape] = executor
        return executor

    # ------------------------------------------------------------------ inference through the partition
    def routed_forward(self, blocks_seq: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        def forward(x: torch.Tensor) -> torch.Tensor:
            return self._executor(tuple(x.shape[1:])).run(x)

        return forward

    # ------------------------------------------------------------------ accounting
    def gather_traffic(self) -> list[LayerTraffic]:
        """Every rank's per-layer figures merged (all ranks call this)."""
        mine = [executor.traffic for executor in self._executors.values()]
        everyone = all_gather_object(mine)
        merged: list[LayerTraffic] = []
        for shape_index, layers in enumerate(everyone[0]):
            for layer_index, layer in enumerate(layers):
                rows = [everyone[r][shape_index][layer_index] for r in range(self.world_size)]
                merged.append(LayerTraffic(
                    layer.name, layer.kind,
                    [rows[r].bytes_sent[r] for r in range(self.world_size)],
                    [rows[r].peers[r] for r in range(self.world_size)],
                    [rows[r].compute_s[r] for r in range(self.world_size)],
                    [rows[r].transfer_s[r] for r in range(self.world_size)],
                ))
        return merged

    def _report(self) -> None:
        if not self._executors:
            return
        self.traffic = self.gather_traffic()
        rank_zero_info(format_traffic(self.traffic, title=f"{self.conv_partition} + {self.fc_partition}"))

    def on_predict_end(self) -> None:
        self._report()
        super().on_predict_end()

    def on_test_end(self) -> None:
        self._report()
        super().on_test_end()

    def on_validation_end(self) -> None:
        self._report()
        super().on_validation_end()

    def teardown(self) -> None:
        self._executors.clear()
        self._messages = None
        super().teardown()


def format_traffic(rows: Sequence[LayerTraffic], title: str = "") -> str:
    """A markdown table: per layer, bytes each worker sent, peers per worker, compute and transfer ms."""
    workers = len(rows[0].bytes_sent) if rows else 0
    lines = [f"Partitioned inference{': ' + title if title else ''}", "",
             "| layer | kind | bytes sent per worker | peers per worker | compute ms per worker | transfer ms per worker |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if not r.total_bytes and not any(r.compute_s):
            continue
        lines.append(
            f"| {r.name} | {r.kind} | {r.bytes_sent} | {[len(p) for p in r.peers]} | "
            f"{[round(1e3 * t, 2) for t in r.compute_s]} | {[round(1e3 * t, 2) for t in r.transfer_s]} |"
        )
    total = [sum(r.bytes_sent[w] for r in rows) for w in range(workers)]
    lines.append(f"| total | | {total} | {[max((len(r.peers[w]) for r in rows), default=0) for w in range(workers)]} (max) | "
                 f"{[round(1e3 * sum(r.compute_s[w] for r in rows if r.compute_s), 2) for w in range(workers)]} | "
                 f"{[round(1e3 * sum(r.transfer_s[w] for r in rows if r.transfer_s), 2) for w in range(workers)]} |")
    return "\n".join(lines)
