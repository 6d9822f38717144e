"""CNeuralStrategy: cNeural's batch-mode master-worker training (Gu et al. 2013, paper 002).

Lightning glue on :class:`~lightning_hybrid.strategies.parameter_server.ParameterServerStrategy`:
the workers never talk to the server during a pass; each sums its gradient over its whole share
and pushes the sum once, at the pass's end.
"""

from __future__ import annotations

from typing import Any

import torch

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
    completed pass. Learning-rate schedulers should use ``interval: epoch`` (one update per pass;
    a ``step`` interval advances per mini-batch).

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
        self.staleness, self.sync = 0.0, "delay"  # the server collects one push per worker per pass
        # This pass's gradient sum (each mini-batch's gradient times its sample count).
        self._pass_grad: torch.Tensor | None = None
        self._pass_samples = 0
        self._step_samples = 0  # samples of the mini-batches since the last optimizer step

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
        self._epoch["iterations"] += 1

    def _before_sync(self) -> None:
        """End of the pass: push the gradient sum once; the server steps once every worker has."""
        flat = self._pass_grad if self._pass_grad is not None else torch.zeros_like(self._flat)
        lrs = [group["lr"] for group in self.optimizers[0].param_groups]
        self._note(self._timed(lambda: self.client.push(flat, lrs, self._flat, weight=self._pass_samples)))
        self._pass_grad, self._pass_samples, self._step_samples = None, 0, 0
        self._load_flat()
