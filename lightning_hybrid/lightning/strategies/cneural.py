# Generated from lightning_hybrid/strategies/cneural.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""CNeuralStrategy: cNeural's batch-mode master-worker training (Gu et al. 2013, paper 002).

Lightning glue on :class:`~lightning_hybrid.lightning.strategies.parameter_server.ParameterServerStrategy`:
the workers never talk to the server during a pass; each sums its gradient over its whole share
and pushes the sum once, at the pass's end.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities.data import _update_dataloader
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from lightning_hybrid.comm.clipping import Clip
from lightning_hybrid.comm.collectives import all_gather
from lightning_hybrid.comm.regroup import live_ranks
from lightning_hybrid.parameter_server.adoption import adopted_shares
from lightning_hybrid.parameter_server.gradient_mask import has_gradient
from lightning_hybrid.parameter_server.hyperparameters import GroupValues
from lightning_hybrid.lightning.strategies.gradient_sum import gradient_sum
from lightning_hybrid.lightning.strategies.parameter_server import ParameterServerStrategy

log = logging.getLogger(__name__)


class CNeuralStrategy(ParameterServerStrategy):
    """Batch-mode master-worker training: one full-batch update per pass over the data.

    Each worker trains through its own share of the data (Lightning's distributed sampler, or the
    resident shards of :class:`~lightning_hybrid.lightning.data.ShardDataModule`) without talking to the
    server, summing every mini-batch's gradient times its sample count; at the end of the pass (the
    epoch) each pushes that sum once, the server applies the mean over all samples of all workers
    in one optimizer step (the user's optimizer: SGD, Adam, ...) and every worker gets the new
    parameters. One pass is one step of full-batch gradient descent. The paper's update adds the
    summed changes with a learning rate; that is this step with the learning rate times the
    training-set size. One worker is allowed.

    Per-epoch checkpoints (``ModelCheckpoint(every_n_epochs=1, save_last=True)``) plus
    ``fit(ckpt_path="last")`` give its crash recovery: rerunning the job resumes from the last
    completed pass.

    A step is a pass: ``trainer.global_step`` counts passes (the optimizer updates the model
    receives), and so does what Lightning drives by steps: ``max_steps`` (that many passes),
    step-interval schedulers (one scheduler step per pass; each pass is applied at the
    hyperparameters in force during it: every number of the param groups, the learning rate, the
    momentum, the betas...), the loggers' step (``log_every_n_steps``), and
    ``ModelCheckpoint(every_n_train_steps=N)``, which saves after every N-th pass's update (at the
    epoch's end, as ``every_n_epochs=N``). Lightning sees each pass as one step whose gradients
    accumulate over the whole epoch (``handles_gradient_accumulation``; the strategy adds each
    mini-batch's gradient, times its samples, to the pass's sum). Epoch-interval schedulers: the
    pass is applied at the values in force during it, not at those the scheduler sets for the next
    epoch when the pass ends. Gradient clipping (``gradient_clip_val``) clips the pass's mean
    gradient at the server, once, as Lightning clips DDP's gradient accumulated over an epoch; the
    workers' mini-batch gradients are not clipped.

    Validation inside a pass (``val_check_interval`` < 1.0) needs no exchange: every worker holds
    the parameters the pass started with until its end. The workers must reach it at the same
    batch (shares of equal length; checked when training starts).

    With ``on_worker_failure="continue"`` a worker that dies does not end the run: its data share
    goes to the next live worker after it (:mod:`~lightning_hybrid.parameter_server.adoption`). In
    the pass it died in, the server holds the round and asks that worker for the share's gradient
    sum at the pass's parameters (:mod:`~lightning_hybrid.lightning.strategies.gradient_sum`: ``training_step``
    outside Lightning's loop, its ``self.log`` calls ignored); in later passes the adopter adds it to
    its own. The share is the lost worker's part of Lightning's distributed split of the epoch, or,
    with a datamodule that has ``read_share(rank, world_size)`` (:class:`~lightning_hybrid.lightning.data.ShardDataModule`),
    its shards, read once and kept resident. Each pass is still full-batch gradient descent over
    every sample.

    Args:
        timeout, on_worker_failure, process_group_backend, processes_per_device: as for
            :class:`~lightning_hybrid.lightning.strategies.parameter_server.ParameterServerStrategy`.

    Examples:
        >>> import lightning.pytorch as pl
        >>> from lightning_hybrid import CNeuralStrategy
        >>> trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=CNeuralStrategy(), logger=False)
        >>> type(pl.Trainer(accelerator="cpu", devices=2, strategy="cneural", logger=False).strategy).__name__
        'CNeuralStrategy'
        >>> # trainer.fit(model, datamodule=ShardDataModule("data/mnist_shards/train", quota="2GiB"), ckpt_path="last")
    """

    strategy_name = "cneural"
    aliases = {"cneural": ("Batch-mode master-worker training, one update per pass (Gu et al. 2013)", {})}
    metrics_prefix = "cneural"
    logged_stats = ("iterations", "samples", "wait_s", "train_s", "samples_per_s")
    min_workers = 1
    #: The pass is one bulk-synchronous round of the server (the rule of ``SSPStrategy(staleness=0)``).
    batch_mode = True
    validates_mid_epoch = True  # every worker holds the pass's parameters until its end
    mid_epoch_checkpoints_instead = (
        "A pass is one update: inside it there is only a partial gradient sum on each worker, which a checkpoint "
        "cannot hold, and Lightning resumes a non-resumable loader mid-epoch from the epoch's first batches. Use "
        "every_n_epochs or every_n_train_steps (a step is a pass: one checkpoint per N passes)."
    )

    def __init__(
        self,
        timeout: float = 300.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(timeout, **kwargs)
        self.staleness, self.sync = 0.0, "delay"  # the server collects one push per worker per pass
        # This pass's gradient sum (each mini-batch's gradient times its sample count).
        self._pass_grad: torch.Tensor | None = None
        self._pass_has_grad: torch.Tensor | None = None  # the tensors with a gradient in any of its mini-batches
        self._pass_samples = 0
        self._step_samples = 0  # samples of the mini-batches since the last optimizer step
        self._pass_values: GroupValues | None = None  # the hyperparameters in force at the pass's mini-batches
        self._pass_clip: Clip | None = None  # how Lightning clipped them: the server clips the pass's mean
        self._taken_over: set[int] = set()  # lost workers whose shares this worker computes
        self._resident_shares: dict[int, Dataset] = {}  # their resident shards (ShardDataModule)

    @property
    def handles_gradient_accumulation(self) -> bool:
        """Lightning calls :meth:`optimizer_step` at every mini-batch (each adds to the pass's sum) and counts
        one optimizer step per pass."""
        return True

    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        self._checkpoint_every_n_passes(trainer)
        super().check_trainer(trainer, model)

    @staticmethod
    def _checkpoint_every_n_passes(trainer: pl.Trainer) -> None:
        """``ModelCheckpoint(every_n_train_steps=N)``: a step is a pass, which ends at the epoch's sync: save
        there, every N epochs."""
        for callback in trainer.callbacks:
            if isinstance(callback, ModelCheckpoint) and callback._every_n_train_steps and callback._train_time_interval is None:
                callback._every_n_epochs, callback._every_n_train_steps = callback._every_n_train_steps, 0
                callback._save_on_train_epoch_end = True
                log.info("CNeuralStrategy: a step is a pass; ModelCheckpoint saves after every %d-th pass",
                         callback._every_n_epochs)

    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        epoch_loop = trainer.fit_loop.epoch_loop
        # One optimizer step per pass: Lightning accumulates until the epoch's last batch.
        epoch_loop._should_accumulate = lambda: not epoch_loop._num_ready_batches_reached()

    # ------------------------------------------------------------------ mid-pass validation
    def on_sync_start(self, trainer: pl.Trainer) -> None:
        super().on_sync_start(trainer)
        if trainer.val_check_interval == 1.0 and trainer.check_val_every_n_epoch is not None:
            return
        counts = [int(t.item()) for t in all_gather(torch.tensor([float(trainer.num_training_batches)]))]
        if len(set(counts)) > 1:
            raise ValueError(
                f"CNeuralStrategy validates inside a pass (val_check_interval={trainer.val_check_interval}) when every "
                f"worker reaches the same batch, but the workers' shares have {counts} batches. Use shares of equal "
                "size (Lightning's distributed sampler, or as many shards per worker), or val_check_interval=1.0."
            )

    def sync_before_validation(self) -> None:
        """Inside a pass nothing is exchanged: the parameters are the pass's on every worker."""
        if not self._inside_pass():
            self.sync_point()

    def _inside_pass(self) -> bool:
        trainer = self.lightning_module.trainer
        return self._async and not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch

    def _workers_meet(self) -> bool:
        return super()._workers_meet() or self.lightning_module.trainer.validating

    def _count_samples(self, samples: int) -> None:
        super()._count_samples(samples)
        self._step_samples += samples

    def _replaced_step(self, optimizer: torch.optim.Optimizer) -> None:
        """At the end of the user's gradient accumulation (every ``accumulate_grad_batches`` mini-batches,
        and the pass's last), add the accumulated mean gradient times its sample count to the pass's sum."""
        epoch_loop = self.lightning_module.trainer.fit_loop.epoch_loop
        self._pass_clip = self._clips.take() or self._pass_clip
        if not (epoch_loop._accumulated_batches_reached() or epoch_loop._num_ready_batches_reached()):
            return  # the user accumulates: .grad sums on
        if self._pass_grad is None:
            self._pass_grad, self._pass_has_grad = torch.zeros_like(self._flat), self._no_gradients()
        self._pass_grad.add_(self._flat_grad(), alpha=float(self._step_samples))
        self._pass_has_grad |= has_gradient(self._params)
        self._pass_samples += self._step_samples
        self._step_samples = 0
        self._pass_values = self._hyperparameters(optimizer)
        self._epoch["iterations"] += 1

    def _before_sync(self) -> None:
        """End of the pass: push the gradient sum once (with the shares of lost workers this worker
        took over); the server steps once every worker's share is in. A worker lost during this pass
        makes the server ask its adopter for its shares' sum before releasing anyone."""
        flat = self._pass_grad if self._pass_grad is not None else torch.zeros_like(self._flat)
        has = self._pass_has_grad if self._pass_has_grad is not None else self._no_gradients()
        samples = self._pass_samples
        # An epoch-interval scheduler has already moved the optimizer to the next epoch's rate (and momentum...).
        hyper = self._pass_values if self._pass_values is not None else self._hyperparameters(self.optimizers[0])
        clip = self._pass_clip
        adopted = adopted_shares(self.global_rank, self._members, self.num_workers)
        if adopted:
            extra, extra_samples, extra_has = self._shares_sum(adopted)
            flat, samples, has = flat + extra, samples + extra_samples, has | extra_has
        info = self._timed(lambda: self.client.push(flat, hyper, self._flat, weight=samples, has_gradient=has, clip=clip))
        while info.adopt:  # a worker was lost during this pass: its shares are this worker's to compute
            shares = info.adopt
            extra, extra_samples, extra_has = self._shares_sum(live_ranks(shares))
            info = self._timed(lambda: self.client.push(extra, hyper, self._flat, weight=extra_samples, shares=shares,
                                                        has_gradient=extra_has, clip=clip))
        self._note(info)
        self._pass_grad, self._pass_has_grad, self._pass_samples, self._step_samples = None, None, 0, 0
        self._pass_values = self._pass_clip = None
        self._load_flat()

    def _no_gradients(self) -> torch.Tensor:
        """A mask of the parameter tensors with a gradient, none set yet."""
        return torch.zeros(len(self._params), dtype=torch.bool)

    # ------------------------------------------------------------------ shares of lost workers
    def _shares_sum(self, ranks: list[int]) -> tuple[torch.Tensor, int, torch.Tensor]:
        """The gradient summed over the samples of workers ``ranks``' shares, at the parameters this
        worker holds (those of the pass), the number of samples, and which tensors had a gradient."""
        total, samples, has = torch.zeros_like(self._flat), 0, self._no_gradients()
        for rank in ranks:
            if rank not in self._taken_over:
                self._taken_over.add(rank)
                log.warning("worker rank %d: took over the data share of lost worker %d", self.global_rank, rank)
            grad, count, share_has = gradient_sum(self.lightning_module, self._params, self._share_loader(rank),
                                                  self.batch_to_device, self.precision_plugin.train_step_context)
            total.add_(grad)
            samples += count
            has |= share_has
        return total, samples, has

    def _share_loader(self, rank: int) -> DataLoader:
        """Worker ``rank``'s training data this epoch (resident shards are read once and kept)."""
        trainer = self.lightning_module.trainer
        loader = trainer.train_dataloader
        if not isinstance(loader, DataLoader):
            raise RuntimeError(
                "CNeuralStrategy(on_worker_failure='continue') takes over a lost worker's share from the training "
                f"DataLoader, but the training data is a {type(loader).__name__}; return one DataLoader"
            )
        read_share = getattr(trainer.datamodule, "read_share", None)
        if callable(read_share):  # resident shards (ShardDataModule): read the lost worker's shards once
            if rank not in self._resident_shares:
                self._resident_shares[rank] = read_share(rank, self.num_workers)
            return DataLoader(self._resident_shares[rank], batch_size=loader.batch_size, collate_fn=loader.collate_fn)
        sampler = loader.sampler
        if isinstance(sampler, DistributedSampler) and sampler.num_replicas == self.num_workers:
            theirs = copy.copy(sampler)  # this epoch's split, the lost worker's part of it
            theirs.rank = rank
            return _update_dataloader(loader, theirs, mode=RunningStage.TRAINING)
        raise RuntimeError(
            "CNeuralStrategy(on_worker_failure='continue') needs each worker's share to be Lightning's distributed "
            f"split (use_distributed_sampler=True) or a datamodule with read_share(rank, world_size); the training "
            f"sampler is a {type(sampler).__name__}"
        )

    def teardown(self) -> None:
        self._taken_over.clear()
        self._resident_shares.clear()
        module = self.lightning_module
        if module is not None and module._trainer is not None:
            vars(module.trainer.fit_loop.epoch_loop).pop("_should_accumulate", None)
        super().teardown()
