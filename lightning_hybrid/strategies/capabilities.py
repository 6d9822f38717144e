"""What the suite's callers ask of a strategy, in one place: every capability, its meaning and its default.

Callbacks, the launcher, the preemption handler and the command ask a strategy things Lightning's
strategies do not answer: can it slow its own compute (a simulated straggler), does it log its ranks' peak
memory itself, can a checkpoint written between two batches resume it? :class:`Capabilities` names each,
with the answer of a strategy that says nothing; the suite's strategies derive from it
(:class:`~lightning_hybrid.strategies.checked_ddp.CheckedDDPStrategy`) and override what they do otherwise.
Callers read :func:`capabilities_of` ``(trainer.strategy)``, which answers with the defaults for any other
strategy (Lightning's ``ddp``, ``single``): no probing with ``hasattr``.

Example::

    >>> from pytorch_lightning.strategies import DDPStrategy
    >>> capabilities_of(DDPStrategy()).resumes_mid_epoch, capabilities_of(DDPStrategy()).slows_its_compute
    (True, False)
"""

from __future__ import annotations

from typing import Any, Protocol


class StrategyHooks(Protocol):
    """What the suite's base strategy (:class:`~lightning_hybrid.strategies.checked_ddp.CheckedDDPStrategy`)
    calls on a strategy, in the order a fit meets them; each has a default there (a no-op, or Lightning's DDP),
    and a strategy overrides what it does otherwise (ARCHITECTURE.md's table of the strategies says which).
    Lightning's own ``Strategy`` methods a strategy overrides (``setup``, ``optimizer_step``, checkpoints) are
    Lightning's interface, not listed here."""

    def check_devices(self) -> None:
        """Before any process starts: refuse a backend that cannot serve the processes' devices."""

    def check_trainer(self, trainer: Any, model: Any) -> None:
        """Before any process starts (fitting), and again at set-up: raise a ValueError for a run it cannot do."""

    def check_training_data(self, loader: object) -> None:
        """Before any process starts, when ``fit`` is given the loader: raise for data it cannot deal."""

    def on_ranks_forked(self) -> None:
        """In the main process right after ``fork_ranks`` forked the other ranks (fork what a rank starts later)."""

    def stop_agreement(self, trainer: Any) -> Any:
        """At set-up: how the ranks agree before each training batch whether to stop
        (:mod:`lightning_hybrid.strategies.agreements`)."""

    def keeps_own_model(self) -> bool:
        """At set-up, without the DDP wrapper: whether this rank resumes its own weights (else rank 0's are
        broadcast)."""

    def on_sync_start(self, trainer: Any) -> None:
        """Sync points (a strategy without the DDP wrapper): training starts."""

    def on_epoch_start(self, trainer: Any) -> None:
        """A training epoch starts (every rank)."""

    def sync_point(self) -> None:
        """Before validation and at each training epoch's end: the ranks' models become one."""

    def sync_before_validation(self) -> None:
        """Before a validation during fitting (default: :meth:`sync_point`)."""

    def after_epoch_sync(self, pl_module: Any) -> None:
        """After the epoch's sync."""

    def on_sync_end(self) -> None:
        """Fitting ends."""


class Capabilities:
    """The answers a strategy gives its callers (see the module docstring); each attribute's default is what a
    strategy that does not say otherwise means."""

    #: A checkpoint written between two batches holds all of the strategy's state, so a run resumed from it
    #: continues the epoch (False: the parameter servers, whose workers are at different clocks; they resume
    #: from the last epoch end). Read by :mod:`lightning_hybrid.preemption`.
    resumes_mid_epoch: bool = True
    #: The strategy logs ``memory/rank<r>_peak_MiB`` itself (the pipeline, beside its plan's estimates), so
    #: :class:`~lightning_hybrid.callbacks.PeakMemoryMonitor` stands aside.
    logs_peak_memory: bool = False
    #: :meth:`inject_compute_slowdown` slows the strategy's own compute (the pipeline's stages, balanced
    #: shares, partitioned inference), where a simulated straggler's time must go inside the step; otherwise
    #: :class:`~lightning_hybrid.callbacks.HeterogeneitySimulator` sleeps after the step.
    slows_its_compute: bool = False
    #: Seconds this rank spent waiting for its peers so far (the simulator's clock subtracts them on GPUs).
    communication_wait_s: float = 0.0
    #: How long a peer may be silent before the strategy itself calls it lost (the watchdog waits a share of it).
    peer_timeout_s: float = float("inf")
    #: The watch over the processes this rank started (None: none, or Lightning's own launcher's).
    rank_exit_watch: Any = None
    #: A parameter server's load report after fitting (rank 0; None: no server).
    server_load: Any = None
    #: Each rank holds only part of the model (the pipeline's stages) and :meth:`limit_memory` places the parts
    #: within a budget; otherwise every rank holds the whole model, which
    #: :class:`~lightning_hybrid.callbacks.MemoryBudget` checks against the budget before training.
    holds_part_of_the_model: bool = False
    #: How a rank holds the whole model, for :func:`~lightning_hybrid.placement.memory.training_memory`'s estimate of
    #: it (a fully sharded strategy: ``{"shards": N, "reshard_after_forward": ...}``; {}: a replica's every copy).
    memory_layout: dict = {}

    def inject_compute_slowdown(self, factor: float) -> None:
        """Make this rank's compute ``factor`` times slower (only where :attr:`slows_its_compute`)."""
        raise NotImplementedError(f"{type(self).__name__} cannot slow its own compute")

    def limit_memory(self, limit_bytes: float) -> None:
        """Keep each rank's part of the model within ``limit_bytes`` (only where :attr:`holds_part_of_the_model`)."""
        raise NotImplementedError(f"{type(self).__name__} holds the whole model on every rank")

    def check_evaluation(self, trainer: Any, model: Any) -> None:
        """Raise for a validate, test or predict run the strategy cannot do, before other processes start."""

    def on_batches_skipped(self, batches: int) -> None:
        """A resumed run skipped ``batches`` training batches of its epoch (trained before the checkpoint)."""


_DEFAULTS = Capabilities()


def capabilities_of(strategy: Any) -> Capabilities:
    """``strategy``'s answers: itself for the suite's strategies, the defaults for any other."""
    return strategy if isinstance(strategy, Capabilities) else _DEFAULTS
