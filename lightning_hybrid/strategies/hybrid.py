"""HybridParallelStrategy: pipeline model parallelism whose stages a placement method puts on
heterogeneous devices, times data parallelism over pipeline replicas (paper 003).

Lightning glue: the placement is :mod:`lightning_hybrid.placement`; the rank layout, stages, schedules and their
executor are the suite's own, :mod:`lightning_hybrid.pipeline` (the schedules are lists of typed actions written in
``torch.distributed.pipelining``'s notation, ``F0 F1 B0 ...``, but neither they nor the executor use that package)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.optimizer import _optimizers_to_device
from pytorch_lightning.overrides.distributed import _sync_module_states
from pytorch_lightning.trainer.states import TrainerFn
from pytorch_lightning.utilities.rank_zero import rank_zero_warn

from lightning_hybrid.comm.collectives import all_gather_object, broadcast_module_
from lightning_hybrid.comm.delayed_allreduce import DelayedAllReduce
from lightning_hybrid.devices import Device, PeakMemory, held_bytes
from lightning_hybrid.pipeline import Mesh, PipelineParallel, StageModule, pipeline_blocks, pipeline_inputs, pipeline_loss
from lightning_hybrid.pipeline.materialize import is_freed
from lightning_hybrid.pipeline.stage_adoption import meta_outside_blocks
from lightning_hybrid.pipeline.stage_executor import describe_stage_times, stage_time_metrics
from lightning_hybrid.placement import Placement
from lightning_hybrid.placement.figure import placement_summary
from lightning_hybrid.placement.pipeline_options import check_pipeline_options, check_stage_sizes
from lightning_hybrid.placement.agreed import agreed_placement, planning_devices
from lightning_hybrid.placement.pipeline_stages import plan_pipeline
from lightning_hybrid.strategies.checked_ddp import CheckedDDPStrategy
from lightning_hybrid.strategies.refusals import (
    refuse_grad_scaler, refuse_manual_optimization, refuse_mid_epoch_checkpoints, single_optimizer)
from lightning_hybrid.strategies.replaced_step import ReplacedStep, unwrap_optimizer
from lightning_hybrid.strategies.even_batches import refuse_uneven_loaders
from lightning_hybrid.strategies.placement_logging import log_placement
from lightning_hybrid.strategies.routed_evaluation import routed_steps
from lightning_hybrid.strategies.stage_state import StageOnlyState

log = logging.getLogger(__name__)

class HybridParallelStrategy(StageOnlyState, CheckedDDPStrategy):
    """Pipeline parallelism x data parallelism, with the stages placed on devices by GABRA (or another method).

    The LightningModule's block sequence (``pipeline_blocks()``, see
    :mod:`lightning_hybrid.pipeline.module_contract`) is cut into ``pipeline_stages`` contiguous stages placed on
    devices by :func:`lightning_hybrid.placement.plan`; each batch runs through the stages in
    ``micro_batches`` by a 1F1B or GPipe schedule, and ``data_parallel`` replicas of the pipeline average
    their gradients. Each rank holds only its stage (a model built in ``configure_model()`` is never whole
    on any rank); checkpoints hold the whole model, and :meth:`full_state_dict` gives it after ``fit``.
    How it works, the memory it needs and what it logs: ``docs/strategies/hybrid.md``.

    Args:
        pipeline_stages: stages per pipeline (devices per replica).
        data_parallel: pipeline replicas; ``trainer.devices * num_nodes`` must equal
            ``pipeline_stages * data_parallel``.
        placement: ``"gabra"``, ``"exact"``, ``"uniform"``, ``"parameters"``, ``"time"`` (see
            :func:`~lightning_hybrid.placement.plan`), or explicit stage sizes, e.g. ``[5, 7]``
            (blocks per stage, on positions 0, 1, ...).
        schedule: ``"1F1B"`` or ``"GPipe"``.
        micro_batches: micro-batches per batch, or ``"auto"`` (the default): rank 0 places the model once for each
            count from the stages to 4 x the stages that divides the batch, its blocks timed on that count's
            micro-batch, and keeps the count whose predicted step is shortest
            (:func:`~lightning_hybrid.placement.micro_batches.choose_micro_batches`). A batch not divisible by the
            count uses the largest divisor below; a batch split into fewer micro-batches than stages runs as GPipe.
        devices: per-position device descriptions (speed, memory, bandwidth; a number is a speed, relative:
            1 is the FLOP/s rank 0 measures, see :mod:`lightning_hybrid.devices`), or ``None`` to measure each
            position's speed with a short probe.
        objective: GABRA's ``"bottleneck"`` or ``"paper"``.
        placement_options: ``block_cost`` (``"auto"``: each block timed on rank 0's device where it can be, a
            model built in ``configure_model()`` one block at a time, else FLOPs; ``"time"``; ``"flops"``: counted,
            the same placement every run), ``memory_headroom`` (0.1: the fraction of each device's memory the
            placement leaves free where it can, :func:`~lightning_hybrid.placement.headroom.keep_headroom`; 0: the
            fastest that fits), GABRA's ``population``, ``t_max``, ...
        seed: GABRA's seed.
        gradient_sync: across replicas, ``"sync"`` (the replicas' gradients averaged at each step, before
            Lightning clips them: DDP's step) or ``"delayed"`` (Pipe-SGD-like: each replica clips its own gradient,
            by the whole model's norm, the clipped gradients are averaged in the background, and the average alone
            is stepped with ``delay`` steps later, at the learning rate and momentum in force then, no momentum
            correction; not ``DelayedAveragingStrategy(method="pipe_sgd")``, which clips the average, applies it at
            the learning rate of the step that computed it and lowers SGD's momentum by default; nor its default
            method, delayed gradient averaging).
        delay: steps of delay for ``"delayed"``.
        input_shape: shape of one sample (e.g. ``[1, 28, 28]``): the plan is made at setup, before
            any stage is materialised or moved to its device, for ``datamodule.batch_size / data_parallel``
            samples (one micro-batch a stage if the Trainer has no datamodule), and with ``devices``
            checked before processes start. Required for a model built in ``configure_model()``.
        optimizer_slots: optimizer state tensors per parameter, for the memory plan (1: SGD with
            momentum, 2: Adam, 0: plain SGD).
        process_group_backend: ``None`` (gloo on CPU, nccl on GPU) or a backend name.
        processes_per_device: processes started on each device the Trainer gives (``devices=1,
            processes_per_device=2``: two processes on one GPU, whose group then uses gloo).

    Examples:
        >>> import pytorch_lightning as pl
        >>> from lightning_hybrid import HybridParallelStrategy
        >>> strategy = HybridParallelStrategy(pipeline_stages=2, data_parallel=2, micro_batches=4,
        ...                                   devices=[1.0, 2.0], placement="gabra")
        >>> trainer = pl.Trainer(accelerator="cpu", devices=4, strategy=strategy, logger=False)
        >>> trainer.world_size  # 2 stages x 2 replicas
        4
        >>> # trainer.fit(ClassifierModule(LeNet5()), datamodule=data)     or strategy="hybrid"
    """

    wraps_model = False  # no DDP wrapper (CheckedDDPStrategy.wraps_model)
    #: evaluation runs the module's blocks through :meth:`routed_forward` (composition: routed_evaluation)
    validation_step, test_step, predict_step = routed_steps(CheckedDDPStrategy)

    strategy_name = "hybrid"
    process_role = "pipeline process"
    logs_peak_memory = True  # memory/rank<r>_peak_MiB beside the plan's estimates (PeakMemoryMonitor stands aside)
    aliases = {"hybrid": ("GABRA-placed pipeline stages x data-parallel replicas (paper 003)", {})}

    def __init__(
        self,
        pipeline_stages: int = 2,
        data_parallel: int = 1,
        placement: str | Sequence[int] = "gabra",
        schedule: str = "1F1B",
        micro_batches: int | str = "auto",
        devices: Sequence[Any] | None = None,
        objective: str = "bottleneck",
        placement_options: dict | None = None,
        seed: int = 0,
        gradient_sync: str = "sync",
        delay: int = 1,
        input_shape: Sequence[int] | None = None,
        optimizer_slots: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        placement, self.given_devices = check_pipeline_options(
            pipeline_stages, data_parallel, placement, schedule, micro_batches, gradient_sync, delay, optimizer_slots, devices,
        )
        self.pipeline_stages = pipeline_stages
        self.data_parallel = data_parallel
        self.given_placement = placement
        self.schedule_name = schedule
        #: As given: a count, or "auto".
        self.micro_batches_setting = micro_batches
        #: The count in use: the given one, or (auto) the planned one once planned.
        self.micro_batches: int | None = None if micro_batches == "auto" else int(micro_batches)
        self.objective = objective
        self.placement_options = dict(placement_options or {})
        self.seed = seed
        self.gradient_sync = gradient_sync
        self.delay = delay
        self.input_shape = None if input_shape is None else [int(s) for s in input_shape]
        self.optimizer_slots = optimizer_slots
        self._init_states: dict[torch.nn.Module, torch.Tensor] | None = None  # noted in configure_model()
        self._peak: PeakMemory | None = None
        #: Bytes each stage may hold (MemoryBudget, ``memory_budget=``): the devices' memory for the plan.
        self.memory_limit: float | list[float] | None = None
        #: Set by lightning_hybrid.sim: this rank's compute is slowed by this factor.
        self.compute_slowdown = 1.0
        #: The placement in use (the same on every rank), once planned.
        self.placement: Placement | None = None
        self.mesh: Mesh | None = None
        #: This rank's part of the pipeline (its stage), once planned; kept for test/predict after fit.
        self.pipeline: PipelineParallel | None = None
        self.exchange: DelayedAllReduce | None = None
        self._pp_group = self._pp_messages = self._dp_group = None  # this rank's MeshGroups (setup)
        self._accumulate = 1
        self._step_grads: list[torch.Tensor | None] = []
        self._planned_for: pl.LightningModule | None = None  # the module whose blocks the pipeline holds
        self._planned_devices: list[Device] = []  # the placement's devices

    # ------------------------------------------------------------------ checks (before processes start)
    @property
    def resumes_mid_epoch(self) -> bool:
        """Per-step gradient sync: a checkpoint between batches holds it all (delayed: not the averages in flight)."""
        return self.gradient_sync == "sync"

    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        """Refuse what the strategy cannot run."""
        Mesh.check(self.pipeline_stages, self.data_parallel, self.num_processes * self.num_nodes)
        refuse_manual_optimization("HybridParallelStrategy", model, "the pipeline schedule runs backward")
        if self.gradient_sync == "delayed":  # replicas' averages in flight between steps
            refuse_mid_epoch_checkpoints("HybridParallelStrategy with gradient_sync='delayed'", trainer)
        refuse_grad_scaler("HybridParallelStrategy", self.precision_plugin)
        if model is None:
            return
        if is_freed(model) and getattr(model, "_pipelined", False):
            raise ValueError(f"{type(model).__name__} was pipelined by an earlier Trainer in this process: each rank kept only "
                             "its stage's parameters. Fit a new module (ckpt_path= restores every stage from a checkpoint)")
        if _builds_in_configure_model(model):
            return  # no blocks before configure_model(): checked at setup, on the meta device
        self._check_module(model)
        if self.input_shape is not None and self.given_devices is not None:
            self._plan(model, torch.zeros(self._batch_hint(trainer), *self.input_shape), self._devices())

    def _check_module(self, model: pl.LightningModule) -> None:
        """The module's part of the checks: its blocks, its loss, the stage sizes (before processes
        start, or at setup for a module that builds its blocks in ``configure_model()``)."""
        blocks = pipeline_blocks(model)
        pipeline_loss(model)  # training runs the blocks, not training_step: a loss must be there
        if type(model).training_step is not pl.LightningModule.training_step and not callable(
            getattr(model, "on_pipeline_step", None)
        ):
            rank_zero_warn(
                f"HybridParallelStrategy trains {type(model).__name__} through its pipeline blocks and loss: its "
                "training_step is not called, so nothing it logs is logged. Log training values in "
                "`on_pipeline_step(self, output, target, loss)` (called after every pipeline step on the last stage).",
                category=UserWarning,
            )
        check_stage_sizes([name for name, _ in blocks.named_children()], self.pipeline_stages, self.given_placement)

    def _batch_hint(self, trainer: pl.Trainer) -> int:
        """A replica's training batch: the datamodule's ``batch_size`` (its loaders' batch on each replica), else
        one sample a micro-batch (a stage's worth where the count is ``"auto"``)."""
        datamodule = trainer.datamodule if hasattr(trainer, "datamodule") else None
        hparams = getattr(datamodule, "hparams", None) or {}
        batch = getattr(datamodule, "batch_size", None) or hparams.get("batch_size")
        return int(batch) if batch else (self.micro_batches or self.pipeline_stages)

    slows_its_compute = True  # Capabilities: a simulated straggler slows the compute itself
    holds_part_of_the_model = True  # Capabilities: each rank holds its stage; a memory budget bounds the plan

    def limit_memory(self, limit_bytes: float | list[float]) -> None:
        """Place the stages so that each fits ``limit_bytes`` (one a pipeline position, or the same for all; beside
        each device's own memory)."""
        self.memory_limit = [float(v) for v in limit_bytes] if isinstance(limit_bytes, list) else float(limit_bytes)

    def inject_compute_slowdown(self, factor: float) -> None:
        """Make this rank's stage compute ``factor`` times slower (heterogeneity simulation)."""
        if not factor >= 1.0:
            raise ValueError(f"compute slowdown must be >= 1, got {factor}")
        self.compute_slowdown = float(factor)

    # ------------------------------------------------------------------ setup
    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        """Shard data over replicas only: the ranks of one pipeline see the same batches."""
        return {"num_replicas": self.data_parallel, "rank": self.global_rank // self.pipeline_stages}

    def on_train_start(self) -> None:
        super().on_train_start()
        self._peak = PeakMemory(self.root_device)  # training's: the stage's tensors, not the data's preparation
        self._peak.start(resident=held_bytes(self.root_device, self.lightning_module, *self.optimizers))

    def setup(self, trainer: pl.Trainer) -> None:
        self.check_trainer(trainer, None)
        module = self.lightning_module
        pipeline_blocks(module)
        if self._pp_group is None:
            layout = Mesh(self.pipeline_stages, self.data_parallel)
            self._pp_group, self._pp_messages, self._dp_group = layout.groups(self.global_rank,
                                                                              self._get_process_group_backend())
        if is_freed(module) and self.placement is None:
            self._check_module(module)  # configure_model() has built its blocks, on the meta device
            if self.input_shape is None:
                raise ValueError(
                    f"{type(module).__name__} was created on the meta device (configure_model()); HybridParallelStrategy "
                    "plans its stages at setup then, from the shape of one sample: set input_shape, e.g. "
                    "HybridParallelStrategy(input_shape=[1, 28, 28]) or strategy.input_shape=[1,28,28]"
                )
        if trainer.state.fn == TrainerFn.FITTING and not is_freed(module) and self.placement is None:
            broadcast_module_(module, src=0)  # DDP's start: rank 0's model, before any rank frees the other stages
        if self.input_shape is not None and self.placement is None:
            example = torch.zeros(self._batch_hint(trainer), *self.input_shape, device="meta")
            self._adopt(self._agreed_placement(module, example))
        self._setup_stage(trainer)
        if trainer.state.fn == TrainerFn.FITTING:
            single_optimizer("HybridParallelStrategy", self.optimizers)
            self._accumulate = max(trainer.accumulate_grad_batches, 1)
            self.attach_sync_points(trainer)
        self._wrap_gradient_clipping()

    def _setup_stage(self, trainer: pl.Trainer) -> None:
        """DDPStrategy.setup without its wrapper, and without its broadcast of rank 0's model before
        evaluation once ranks hold only their stages (rank 0's tensors of other stages are empty)."""
        fitting = trainer.state.fn == TrainerFn.FITTING
        self.accelerator.setup(trainer)
        if fitting and self._layer_sync:
            self.model = self._layer_sync.apply(self.model)
        self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        if fitting:
            self.setup_optimizers(trainer)
        elif self.placement is None:  # decided alike on every rank: nothing is freed before a placement
            _sync_module_states(self.model)
        self.setup_precision_plugin()
        if fitting:
            _optimizers_to_device(self.optimizers, self.root_device)

    # ------------------------------------------------------------------ placement
    def _devices(self) -> list[Device]:
        """The pipeline positions' devices (given, or probed: every rank calls it), within the memory budget."""
        return planning_devices(self.given_devices, self.pipeline_stages, self.root_device, self.compute_slowdown,
                                self.memory_limit)

    def _plan(self, module: pl.LightningModule, batch: torch.Tensor, devices: list[Device]) -> Placement:
        """Place the module's blocks on micro-batches of ``batch`` (a replica's batch, or its shape), choosing the
        micro-batch count under ``"auto"`` (:func:`plan_pipeline`)."""
        blocks = pipeline_blocks(module)
        return plan_pipeline(blocks, batch, devices, self.given_placement, self.pipeline_stages, self.objective, self.seed,
                             self.placement_options, self.optimizer_slots, self.schedule_name, self.micro_batches,
                             checkpointed=bool(getattr(blocks, "checkpoint_blocks", False)),
                             time_on=self.root_device if self.parallel_devices else None)

    def _agreed_placement(self, module: pl.LightningModule, batch: torch.Tensor) -> Placement:
        """Rank 0 plans with ``batch`` (:meth:`_plan`); every rank gets the placement (and the micro-batch count),
        or its error (:mod:`lightning_hybrid.placement.agreed`)."""
        devices = self._devices()
        placement = agreed_placement(self.global_rank, lambda: self._plan(module, batch, devices))
        self._planned_devices = devices
        return placement

    def _adopt(self, placement: Placement) -> None:
        """Use ``placement``: this rank keeps (or materialises) its stage's blocks and frees the others."""
        self.placement, self.lightning_module._pipelined = placement, True  # no second fit of it (check_trainer)
        self.micro_batches = int(placement.notes.get("micro_batches", self.micro_batches))
        self.mesh = Mesh(self.pipeline_stages, self.data_parallel, tuple(placement.device_order))
        stage = self.placement.stages[self.mesh.stage_of(self.global_rank)]
        names, blocks = zip(*pipeline_blocks(self.lightning_module).named_children())
        self._stage_blocks(list(blocks), list(names), range(stage.start, stage.stop))  # StageOnlyState
        outside = meta_outside_blocks(self.lightning_module, blocks)
        if outside:
            raise ValueError(f"parameters outside pipeline_blocks() are on the meta device ({', '.join(outside[:5])}): "
                             "create them outside configure_model(), or inside a block")

    def _ensure_pipeline(self, inputs: torch.Tensor) -> PipelineParallel:
        """This rank's stage of the pipeline; planned on rank 0 with one micro-batch of the first batch
        unless it was at setup (``input_shape``)."""
        module = self.lightning_module
        if self.pipeline is not None and self._planned_for is module:  # every step: no search for the blocks
            return self.pipeline
        if self.placement is None:
            # this batch, or the training batch when this one is smaller (validation's last)
            size = max(len(inputs), self._batch_hint(module.trainer))
            batch = inputs[:1].expand(size, *inputs.shape[1:]) if self.given_placement != "time" else inputs[:size]
            self._adopt(self._agreed_placement(module, batch))
        devices = self._planned_devices
        sequence = pipeline_blocks(module)
        named = list(sequence.named_children())
        self.pipeline = PipelineParallel(
            named, [(st.start, st.stop) for st in self.placement.stages], self.mesh, self.global_rank, self._pp_group,
            self.root_device, slowdown=self.compute_slowdown, message_group=self._pp_messages,
            checkpointed=bool(getattr(sequence, "checkpoint_blocks", False)),
        )
        self._planned_for = module
        if self.data_parallel > 1:  # the replicas of a stage start alike (materialised ones too)
            broadcast_module_(self.pipeline.stage_module, src=torch.distributed.get_global_rank(self._dp_group, 0), group=self._dp_group)
        if self.global_rank == 0:
            names = [name for name, _ in named]
            log.info("HybridParallelStrategy: %s", placement_summary(self.placement, devices, names, self.mesh.order))
            self._log_placement(devices, names)
        return self.pipeline

    def _log_placement(self, devices: list[Device], names: list[str]) -> None:
        """Rank 0, once planned: the placement in use to the Trainer's TensorBoard loggers (:func:`log_placement`)."""
        trainer = getattr(self.lightning_module, "_trainer", None)
        ranks = [[self.mesh.stage_rank(r, s) for r in range(self.data_parallel)] for s in range(self.pipeline_stages)]
        log_placement(trainer.loggers if trainer is not None else [], self.placement, devices, names, ranks,
                      self.schedule_name, self.micro_batches)

    @property
    def stage_module(self) -> StageModule | None:
        """This rank's stage (once planned)."""
        return None if self.pipeline is None else self.pipeline.stage_module

    # ------------------------------------------------------------------ training
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        module = self.lightning_module
        inputs, target = pipeline_inputs(module, args[0])
        pipeline = self._ensure_pipeline(inputs)
        # The schedule runs backward now, but Lightning zeroes gradients between training_step and
        # backward: keep this step's gradients aside and add them in backward(). The earlier ones
        # are kept only while gradients accumulate over batches (else Lightning drops them anyway,
        # and holding them would double the stage's gradient memory).
        params = list(pipeline.stage_module.parameters())
        earlier = [p.grad if self._accumulate > 1 else None for p in params]
        for p in params:
            p.grad = None
        with self.precision_plugin.train_step_context():
            loss, output = pipeline.train_step(
                inputs, target, pipeline_loss(module), self.schedule_name, self.micro_batches, 1.0 / self._accumulate,
            )
        self._step_grads = [p.grad for p in params]
        for p, grad in zip(params, earlier):
            p.grad = grad
        if callable(getattr(module, "on_pipeline_step", None)):
            module.on_pipeline_step(output, target, loss)
        return loss

    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The schedule has run backward already: only Lightning's before/after-backward hooks remain."""
        if self.pipeline is None:
            return super().backward(closure_loss, optimizer, *args, **kwargs)
        module = self.lightning_module
        closure_loss = self.precision_plugin.pre_backward(closure_loss, module)
        for p, grad in zip(self.pipeline.stage_module.parameters(), self._step_grads):
            if grad is not None:
                p.grad = grad if p.grad is None else p.grad + grad
        self._step_grads = []
        closure_loss = self.precision_plugin.post_backward(closure_loss, module)
        return closure_loss

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        model = model or self.lightning_module
        if self.data_parallel == 1:
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        if self.gradient_sync == "delayed":  # clip the replica's own gradient, apply the average later
            step = ReplacedStep(unwrap_optimizer(optimizer), self._exchange_and_step)
            return self.precision_plugin.optimizer_step(step, model=model, closure=closure, **kwargs)

        def averaged_closure() -> Any:  # average before Lightning clips the gradients
            result = closure()
            self._replica_exchange().push()
            self.exchange.load_ready_into_grads()
            return result

        return super().optimizer_step(optimizer, averaged_closure, model, **kwargs)

    def _replica_exchange(self) -> DelayedAllReduce:
        """The replicas' all-reduce of this rank's stage (delay 0 averages at once), made once the first step's
        closure has built the stage (without a sanity check, the first step plans)."""
        if self.exchange is None:
            delay = self.delay if self.gradient_sync == "delayed" else 0
            self.exchange = DelayedAllReduce(list(self.pipeline.stage_module.parameters()), delay, group=self._dp_group)
        return self.exchange

    def _exchange_and_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._replica_exchange().push()
        if self.exchange.load_ready_into_grads():
            optimizer.step()

    def on_epoch_start(self, trainer: pl.Trainer) -> None:
        refuse_uneven_loaders(type(self).__name__, trainer)  # every stage and replica takes as many batches

    def sync_point(self) -> None:
        if self.exchange is None:
            return
        self.exchange.apply_pending(self.optimizers[0])

    def on_sync_end(self) -> None:
        self.sync_point()

    def after_epoch_sync(self, pl_module: pl.LightningModule) -> None:
        """Each rank's peak memory beside its stage's estimate, and where its stage's time went in
        the epoch's training steps (every rank logs every rank's)."""
        peak = self._peak.peak() if self._peak is not None else None
        estimate = None
        if self.placement is not None and self.mesh is not None:
            estimate = self.placement.stages[self.mesh.stage_of(self.global_rank)].memory
        profile = self.pipeline.executor.profile if self.pipeline is not None else None
        figures = all_gather_object((peak, estimate, profile.as_dict() if profile is not None else None))
        if profile is not None:
            profile.reset()
        per_rank = [times for _, _, times in figures]
        stage_times = stage_time_metrics(per_rank)
        for key, value in stage_times.items():
            pl_module.log(key, value, sync_dist=True)  # the same on every rank
        if stage_times and self.global_rank == 0:
            log.info("HybridParallelStrategy time a training step (ms): %s", describe_stage_times(per_rank))
        report = []
        for rank, (peak, estimate, _) in enumerate(figures):
            if peak is not None:
                pl_module.log(f"memory/rank{rank}_peak_MiB", peak / 2**20, sync_dist=True)  # the same on every rank
            if estimate is not None and estimate != float("inf"):
                pl_module.log(f"memory/rank{rank}_estimate_MiB", estimate / 2**20, sync_dist=True)
            if peak is not None and estimate is not None:
                report.append(f"rank {rank} {peak / 2**20:.0f} / {estimate / 2**20:.0f}")
        if report and self.global_rank == 0:
            log.info("HybridParallelStrategy memory, peak (the stage's tensors included) / the plan's estimate (MiB): %s", "; ".join(report))

    def _wrap_gradient_clipping(self) -> None:
        """Clip by the norm of the whole model's gradient, summed over the pipeline's stages."""
        plugin = self.precision_plugin
        if getattr(plugin, "_hybrid_clip_wrapped", False):
            return
        strategy = self

        def clip_grad_by_norm(optimizer: Any, clip_val: float) -> None:
            if strategy.pipeline is None:
                return type(plugin).clip_grad_by_norm(plugin, optimizer, clip_val)
            strategy.pipeline.clip_grad_norm_(clip_val)

        plugin.clip_grad_by_norm = clip_grad_by_norm
        plugin._hybrid_clip_wrapped = True

    # ------------------------------------------------------------------ evaluation through the pipeline
    def routed_forward(self, blocks_seq: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        def forward(x: torch.Tensor) -> torch.Tensor:
            return self._ensure_pipeline(x).forward(x, self.micro_batches)

        return forward

    def teardown(self) -> None:
        self.exchange = None
        super().teardown()


def _builds_in_configure_model(model: pl.LightningModule) -> bool:
    """The module has no parameters yet and overrides ``configure_model()`` (it builds its layers there)."""
    overridden = type(model).configure_model is not pl.LightningModule.configure_model
    return overridden and next(iter(model.parameters()), None) is None
