"""CNeuralStrategy: cNeural's batch-mode master-worker training (Gu et al. 2013, paper 002).

Lightning glue on :class:`~lightning_hybrid.strategies.parameter_server.ParameterServerStrategy`:
the workers never talk to the server during a pass; each sums its gradient over its whole share
and pushes the sum once, at the pass's end.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.trainer.states import TrainerFn

from lightning_hybrid.comm.delayed_allreduce import learning_rates
from lightning_hybrid.strategies.parameter_server import ParameterServerStrategy


class CNeuralStrategy(ParameterServerStrategy):
    """Batch-mode master-worker training: one full-batch update per pass over the data.

    Each worker trains through its own share of the data (Lightning's distributed sampler, or the
    resident shards of :class:`~lightning_hybrid.data.ShardDataModule`) without talking to the
    server, summing every mini-batch's gradient times its sample count; at the end of the pass (the
    epoch) each pushes that sum once, the server applies the mean over all samples of all workers
    in one optimizer step (the user's optimizer: SGD, Adam, ...) and every worker gets the new
    parameters. One pass is one step of full-batch gradient descent. The paper's update adds the
    summed changes with a learning rate; that is this step with the learning rate times the
    training-set size. One worker is allowed.

    Per-epoch checkpoints (``ModelCheckpoint(every_n_epochs=1, save_last=True)``) plus
    ``fit(ckpt_path="last")`` give its crash recovery: rerunning the job resumes from the last
    completed pass.

    Learning-rate schedulers: the pass's update is applied at the learning rates in force during
    the pass (recorded at its mini-batches), not at those an epoch-interval scheduler sets for the
    next epoch when the pass ends: ``interval: "epoch"`` means "per update", as the user means it.
    A ``"step"`` interval advances once per mini-batch while the pass makes one update, so the pass
    is applied at the rate of its last mini-batch; that is warned about when fitting starts.

    Args:
        timeout, process_group_backend, processes_per_device: as for
            :class:`~lightning_hybrid.strategies.parameter_server.ParameterServerStrategy`.

    Example::

        >>> import pytorch_lightning as pl
        >>> from lightning_hybrid import CNeuralStrategy
        >>> trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=CNeuralStrategy())  # or strategy="cneural"
    """

    strategy_name = "cneural"
    aliases = {"cneural": ("Batch-mode master-worker training, one update per pass (Gu et al. 2013)", {})}
    metrics_prefix = "cneural"
    logged_stats = ("iterations", "samples", "wait_s", "train_s", "samples_per_s")
    min_workers = 1
    #: The pass is one bulk-synchronous round of the server (the rule of ``SSPStrategy(staleness=0)``).
    batch_mode = True

    def __init__(
        self,
        timeout: float = 300.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(timeout, **kwargs)
        if self.on_worker_failure == "continue":
            raise ValueError(
                "CNeuralStrategy(on_worker_failure='continue') is not supported yet: a lost worker's share of the pass "
                "would be missing from that pass's update. Use 'stop' with per-epoch checkpoints and ckpt_path='last' "
                "(the rerun resumes from the last completed pass)."
            )
        self.staleness, self.sync = 0.0, "delay"  # the server collects one push per worker per pass
        # This pass's gradient sum (each mini-batch's gradient times its sample count).
        self._pass_grad: torch.Tensor | None = None
        self._pass_samples = 0
        self._step_samples = 0  # samples of the mini-batches since the last optimizer step
        self._pass_lrs: list[float] | None = None  # the learning rates in force at the pass's mini-batches

    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        self._warn_step_interval_schedulers(trainer.lr_scheduler_configs)

    @staticmethod
    def _warn_step_interval_schedulers(configs: list[Any]) -> None:
        stepwise = [type(c.scheduler).__name__ for c in configs if c.interval == "step"]
        if stepwise:
            warnings.warn(
                f"CNeuralStrategy makes one update per pass (epoch), but the scheduler {', '.join(stepwise)} has "
                "interval 'step': it advances once per mini-batch, and each pass is applied at the learning rate of "
                "its last mini-batch. Return the scheduler with interval 'epoch' to change the rate per update.",
                UserWarning, stacklevel=2,
            )

    def _count_samples(self, samples: int) -> None:
        super()._count_samples(samples)
        self._step_samples += samples

    def _replaced_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Add this step's mean gradient times its sample count to the pass's sum."""
        if self._pass_grad is None:
            self._pass_grad = torch.zeros_like(self._flat)
        self._pass_grad.add_(self._flat_grad(), alpha=float(self._step_samples))
        self._pass_samples += self._step_samples
        self._step_samples = 0
        self._pass_lrs = learning_rates(optimizer)
        self._epoch["iterations"] += 1

    def _before_sync(self) -> None:
        """End of the pass: push the gradient sum once; the server steps once every worker has."""
        flat = self._pass_grad if self._pass_grad is not None else torch.zeros_like(self._flat)
        # An epoch-interval scheduler has already moved the optimizer to the next epoch's rate.
        lrs = self._pass_lrs if self._pass_lrs is not None else learning_rates(self.optimizers[0])
        self._note(self._timed(lambda: self.client.push(flat, lrs, self._flat, weight=self._pass_samples)))
        self._pass_grad, self._pass_samples, self._step_samples, self._pass_lrs = None, 0, 0, None
        self._load_flat()
