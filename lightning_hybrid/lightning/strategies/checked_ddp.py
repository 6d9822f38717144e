# Generated from lightning_hybrid/strategies/checked_ddp.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""The one base of the suite's strategies: Lightning's DDP with pre-launch checks, atomic checkpoints, a watch
over the processes it starts, the ranks' agreement to stop, and, for a strategy that exchanges gradients its own
way (``wraps_model = False``), the model left unwrapped and its sync hooks called at the sync points."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_hybrid.comm.collectives import broadcast_module_, ddp_group, workers_backend
from lightning_hybrid.deprecation import renamed_alias
from lightning_hybrid.strategies.capabilities import Capabilities
from lightning_hybrid.lightning.strategies.checkpoint_io import AtomicCheckpointIO
from lightning_hybrid.lightning.strategies.launcher import CheckingLauncher
from lightning_hybrid.strategies.agreements import Agreement, Deferred, EveryBatch
from lightning_hybrid.lightning.strategies.meeting import meeting
from lightning_hybrid.strategies.rank_exit_watch import CHILD_GRACE_S, LAUNCHER_PID_ENV, RankExitWatch, die_with_parent
from lightning_hybrid.lightning.strategies.refusals import single_optimizer
from lightning_hybrid.lightning.strategies.sync_points import SyncPoints


#: DDP communication hooks that start further all-reduces from a bucket's completion (torch's PowerSGD):
#: on gloo their order across several buckets differs between ranks, so they get one bucket there.
CHAINED_HOOKS = ("powerSGD_hook", "batched_powerSGD_hook")


def one_bucket_mb(model: torch.nn.Module) -> float:
    """A ``bucket_cap_mb`` that holds all of ``model``'s trainable parameters in one DDP bucket."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad) / 2**20 + 1


class CheckedDDPStrategy(Capabilities, DDPStrategy):
    """Lightning's DDP with the suite's conventions: ``processes_per_device`` processes on each device,
    the workers' backend chosen by :func:`~lightning_hybrid.comm.collectives.workers_backend`, a
    launcher that asks the strategy to refuse what it cannot run before any other process starts
    (:meth:`check_devices`, :meth:`check_trainer`) and watches the processes it starts
    (:mod:`~lightning_hybrid.strategies.rank_exit_watch`), checkpoints saved atomically
    (:class:`~lightning_hybrid.lightning.strategies.checkpoint_io.AtomicCheckpointIO`), registry names declared
    as data (:attr:`aliases`), and one callback of its own attached for a fit (:meth:`attach_callback`).
    The model is wrapped in DistributedDataParallel as usual (``ddp_kwargs`` go to it).

    ``fork_ranks=True`` starts the other ranks of a machine by forking the main process when the
    Trainer launches (:mod:`~lightning_hybrid.strategies.forked_ranks`) instead of running the script
    again: no second import of torch and Lightning (about 4 s of CPU per rank), and, as with a re-run
    script, every rank then runs the script's code after the Trainer call. The script's code before
    that call runs once, in the main process, and CUDA must not be initialized before it (refused
    with an error otherwise). Off by default: a re-run script is what Lightning users expect.

    Args:
        accelerator: Lightning's accelerator (set by the Trainer from ``accelerator=``).
        parallel_devices: the devices of this machine's ranks (set by the Trainer from ``devices=``).
        cluster_environment: where the ranks learn their ranks (set by the Trainer: SLURM, torchrun, ...).
        checkpoint_io: how checkpoints are written; default: atomically (a temporary file renamed).
        precision_plugin: Lightning's precision plugin (set by the Trainer from ``precision=``).
        process_group_backend: ``None``: ``nccl`` with one process per GPU, else ``gloo`` (CPU, processes
            sharing a GPU); or name it.
        processes_per_device: processes on each device (2: two ranks share each GPU, over gloo);
            ``trainer.devices`` above the GPU count sets it on the command line.
        fork_ranks: start the other ranks by forking the main process (see above), not by running the
            script again; ``"auto"``: fork when the ranks run on the CPU, rerun the script otherwise
            (the command line's default).
        ddp_kwargs: keyword arguments of ``DistributedDataParallel`` (strategies that wrap the model).
    """

    #: Lightning registry names of the strategy: name -> (description, constructor arguments).
    aliases: ClassVar[dict[str, tuple[str, dict[str, Any]]]] = {}
    #: Registry names renamed, old -> new (one of :attr:`aliases`), kept for a release: choosing one warns.
    renamed_aliases: ClassVar[dict[str, str]] = {}
    #: What the rank processes are called in the message that ends a run when one dies.
    process_role: ClassVar[str] = "worker"
    #: Whether the model is wrapped in DistributedDataParallel. False: the strategy exchanges gradients its own
    #: way; every rank starts from rank 0's weights (as DDP's wrapper makes them), and the sync hooks
    #: (:class:`~lightning_hybrid.strategies.capabilities.StrategyHooks`) run at the sync points
    #: :meth:`attach_sync_points` attaches.
    wraps_model: ClassVar[bool] = True
    #: The exchange's process group of a strategy that does not wrap the model (its own: its collectives run in
    #: the background), made once by :meth:`setup_exchange`.
    exchange_group: Any = None

    @property
    def forks_ranks(self) -> bool:
        """Whether the launcher forks the other ranks: ``fork_ranks=True``, or ``"auto"`` with the ranks on the CPU
        (a forked process cannot use a CUDA context; with GPUs each rank reruns the script)."""
        if self.fork_ranks == "auto":
            return all(device.type == "cpu" for device in self.parallel_devices or [torch.device("cpu")])
        return bool(self.fork_ranks)

    def __init__(
        self,
        *,
        accelerator: Any = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: Any = None,
        checkpoint_io: Any = None,
        precision_plugin: Any = None,
        process_group_backend: str | None = None,
        processes_per_device: int = 1,
        fork_ranks: bool = False,
        ddp_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(processes_per_device, bool) or not isinstance(processes_per_device, int) or processes_per_device < 1:
            raise ValueError(f"processes_per_device must be a positive integer, got {processes_per_device!r}")
        if not (isinstance(fork_ranks, bool) or fork_ranks == "auto"):
            raise ValueError(f"fork_ranks must be True, False or 'auto', got {fork_ranks!r}")
        self.processes_per_device = processes_per_device
        self.fork_ranks = fork_ranks
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io if checkpoint_io is not None else AtomicCheckpointIO(),
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            start_method="popen",
            **(ddp_kwargs or {}),
        )
        self._own_callback: Callback | None = None
        self._backend_note_logged = False

    @property
    def parallel_devices(self) -> list[torch.device] | None:
        return self._parallel_devices

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device] | None) -> None:
        """Each device the Trainer gives runs ``processes_per_device`` processes (e.g. two workers on one GPU)."""
        if devices is not None and self.processes_per_device > 1:
            devices = [device for device in devices for _ in range(self.processes_per_device)]
        self._parallel_devices = devices

    def _get_process_group_backend(self) -> str:
        """The workers' backend: NCCL for one process per GPU, gloo on CPU or when processes share a GPU
        (:func:`~lightning_hybrid.comm.collectives.workers_backend`)."""
        backend, note = workers_backend(self.parallel_devices or [self.root_device], self._process_group_backend)
        if note and not self._backend_note_logged:
            rank_zero_info(f"{type(self).__name__}: {note}")
            self._backend_note_logged = True
        return backend

    def setup_distributed(self) -> None:
        """Lightning's, but the default group is bound to a CUDA device only under NCCL.

        Lightning binds every CUDA run's default group to the rank's device (``device_id``). Under gloo
        (processes sharing a GPU) torch then builds each later ``new_group`` by splitting the default
        group, which gloo cannot do: ranks outside the new group fail with "'ProcessGroupGloo' object
        has no attribute 'perform_nocolor_split'" (torch 2.11), e.g. the pipeline's stage groups."""
        from lightning.fabric.utilities.distributed import _init_dist_connection
        from lightning.fabric.utilities.seed import reset_seed

        reset_seed()
        self.set_world_ranks()
        self._process_group_backend = self._get_process_group_backend()
        assert self.cluster_environment is not None
        bind = self.root_device.type == "cuda" and self._process_group_backend == "nccl"
        _init_dist_connection(self.cluster_environment, self._process_group_backend, timeout=self._timeout,
                              device_id=self.root_device if bind else None)

    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        meeting(trainer).attach().agree_by(self.stop_agreement(trainer))

    def stop_agreement(self, trainer: pl.Trainer) -> Agreement:
        """How this strategy's ranks agree before each training batch whether to stop
        (:mod:`lightning_hybrid.lightning.strategies.meeting`; called at every setup). Fitting: a MAX all-reduce
        of the ranks' requests started each step and read at the next (:class:`Deferred`): the ranks
        meet in every step anyway, and a collective waited for before each batch would add a network
        round trip to every step. Else one before each batch."""
        if trainer.state.fn == TrainerFn.FITTING:
            return Deferred(lag=max(int(trainer.accumulate_grad_batches or 1), 1))
        return EveryBatch()

    def requested_stop(self) -> int:
        """The signal this rank was asked to stop on (0: none), for an exchange to carry."""
        module = self.lightning_module
        return meeting(module.trainer).requested if module is not None and module._trainer is not None else 0

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Lightning's DDP wrapper, over :func:`~lightning_hybrid.comm.collectives.ddp_group` (a group
        without torch's collective checker where ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` would crash DDP). Without
        it (:attr:`wraps_model` False), what it does first: every rank takes rank 0's parameters and buffers
        (ranks that built different weights, unseeded, train one model), unless this rank resumes its own
        state (:meth:`keeps_own_model`)."""
        if not self.wraps_model:
            if not self.keeps_own_model():
                broadcast_module_(model, src=0)
            return model
        group, kwargs = ddp_group(), self._ddp_kwargs
        if group is not None:
            self._ddp_kwargs = {"process_group": group, **kwargs}
        if self._ddp_comm_hook is not None and getattr(self._ddp_comm_hook, "__name__", "") in CHAINED_HOOKS \
                and "bucket_cap_mb" not in kwargs and dist.get_backend(group) == "gloo":
            self._ddp_kwargs = {**self._ddp_kwargs, "bucket_cap_mb": one_bucket_mb(model)}
            rank_zero_info(f"{type(self).__name__}: {self._ddp_comm_hook.__name__} on gloo: one gradient bucket "
                           f"(bucket_cap_mb={self._ddp_kwargs['bucket_cap_mb']:.0f}); with several, its chained "
                           "all-reduces are started from gloo's completion threads in an order that differs between "
                           "ranks (a collective size mismatch). Set ddp_kwargs.bucket_cap_mb to choose.")
        try:
            return super()._setup_model(model)
        finally:
            self._ddp_kwargs = kwargs

    def _register_ddp_hooks(self) -> None:
        """DDP's communication hook (``ddp_comm_hook``: bf16 or fp16 compression, PowerSGD, ...) on every
        device and backend: Lightning registers it on CUDA only, and silently trains without it elsewhere. None
        without the DDP wrapper."""
        if self._ddp_comm_hook is None or not self.wraps_model:
            return
        from lightning.pytorch.overrides.distributed import _register_ddp_comm_hook

        _register_ddp_comm_hook(model=self.model, ddp_comm_state=self._ddp_comm_state, ddp_comm_hook=self._ddp_comm_hook,
                                ddp_comm_wrapper=self._ddp_comm_wrapper)

    def check_devices(self) -> None:
        """Refuse a backend that cannot serve the processes' devices (called before processes start)."""
        workers_backend(self.parallel_devices or [], self._process_group_backend)

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        """Register :attr:`aliases` with Lightning's ``StrategyRegistry`` (replacing the entries that
        ``import lightning_hybrid`` may have put there for the other namespace's flavour)."""
        for name, factory, description, init_params in cls.registry_entries(cls):
            strategy_registry.register(name, factory, description=description, override=True, **init_params)

    @classmethod
    def registry_entries(cls, build: Callable[..., Any]) -> Iterator[tuple[str, Callable[..., Any], str, dict[str, Any]]]:
        """Each registry name's (name, factory, description, constructor arguments), ``build`` making the strategy;
        a renamed alias's factory warns first (:func:`lightning_hybrid.deprecation.renamed_alias`)."""
        for name, (description, init_params) in cls.aliases.items():
            yield name, build, description, init_params
        for old, new in cls.renamed_aliases.items():
            description, init_params = cls.aliases[new]
            yield old, renamed_alias(build, old, new), f"Renamed {new!r}: {description}", init_params

    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        """Raise a ValueError for a run this strategy cannot do."""

    def check_training_data(self, loader: object) -> None:
        """Raise for training data this strategy cannot deal (before other processes start, when the
        loader is given to ``fit`` directly)."""

    def _configure_launcher(self) -> None:
        assert self.cluster_environment is not None
        self._launcher = CheckingLauncher(self, self.cluster_environment, self.num_processes, self.num_nodes)

    @property
    def worker_loss_is_fatal(self) -> bool:
        """Whether the death of a rank other than 0 ends the run (else the run goes on without it)."""
        return True

    def on_ranks_forked(self) -> None:
        """Called in the main process right after ``fork_ranks`` forked the other ranks, before any
        thread or process group exists: the moment to fork what a rank will start later."""

    @property
    def rank_exit_watch(self) -> RankExitWatch | None:
        """The watch over the run's processes (in the process that started them; None elsewhere)."""
        return getattr(self._launcher, "watch", None)

    @staticmethod
    def _started_by_our_launcher() -> bool:
        return os.environ.get(LAUNCHER_PID_ENV) not in (None, str(os.getpid()))

    def setup_environment(self) -> None:
        if self._started_by_our_launcher():
            die_with_parent()  # no rank outlives the main process
        super().setup_environment()

    def on_exception(self, exception: BaseException) -> None:
        """A rank's run failed. The main process ends the run: naming a process that died first if
        one did, else stopping the others so that its own error is printed last. A started rank
        first gives the main process time to do that (its failure may follow another's death)."""
        super().on_exception(exception)
        if self.rank_exit_watch is not None:
            self.rank_exit_watch.after_own_error()
        elif self._started_by_our_launcher():
            time.sleep(CHILD_GRACE_S)

    def attach_callback(self, trainer: pl.Trainer, callback: Callback) -> None:
        """Run ``callback`` during this fit, before the user's callbacks (removed at teardown)."""
        self._own_callback = callback
        trainer.callbacks.insert(0, callback)

    def teardown(self) -> None:
        module = self.lightning_module
        if module is not None and module._trainer is not None:
            meeting(module.trainer).detach()
            if self._own_callback in module.trainer.callbacks:
                module.trainer.callbacks.remove(self._own_callback)
        self._own_callback = None
        super().teardown()

    # ------------------------------------------------------------------ a strategy that exchanges its own way
    def keeps_own_model(self) -> bool:
        """Whether this rank's model is its own at set-up (a checkpoint written between sync points gave
        each rank its own weights), so that rank 0's is not broadcast."""
        return False

    def setup_exchange(self, trainer: pl.Trainer) -> tuple[torch.optim.Optimizer, list[torch.Tensor]]:
        """A fit's checks (:meth:`check_trainer`), then its one optimizer and that optimizer's
        parameters, in the order every rank shares; :attr:`exchange_group` made on first use."""
        self.check_trainer(trainer, self.lightning_module)
        optimizer = single_optimizer(type(self).__name__, self.optimizers)
        if self.exchange_group is None:
            self.exchange_group = torch.distributed.new_group(backend=self._get_process_group_backend())
        return optimizer, [p for group in optimizer.param_groups for p in group["params"]]

    def attach_sync_points(self, trainer: pl.Trainer) -> None:
        """Call this strategy's sync hooks during this fit, before the user's callbacks."""
        self.attach_callback(trainer, SyncPoints(self))

    def on_sync_start(self, trainer: pl.Trainer) -> None:
        """Training starts (:class:`~lightning_hybrid.strategies.capabilities.StrategyHooks`)."""

    def on_epoch_start(self, trainer: pl.Trainer) -> None:
        """A training epoch starts (every rank)."""

    def sync_point(self) -> None:
        """Before validation and at each training epoch's end."""

    def sync_before_validation(self) -> None:
        """Before a validation during fitting (default: :meth:`sync_point`)."""
        self.sync_point()

    def after_epoch_sync(self, pl_module: pl.LightningModule) -> None:
        """After the epoch's sync."""

    def on_sync_end(self) -> None:
        """Fitting ends."""
