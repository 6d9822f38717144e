# Generated from lightning_hybrid/strategies/step_count.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""``trainer.global_step`` as the number of optimizer updates the model has received, where those
updates are not Lightning's own optimizer steps (Lightning glue).

Under a parameter server the optimizer steps are the server's: a worker pushes a gradient at each of
its batches, and the parameters it pulls back carry the number of steps the server has taken. That
number is the worker's ``trainer.global_step`` here (:class:`ServerSteps`): after every batch and at
every synchronization it is set to the server's count (plus the steps a resumed checkpoint had), and
step-interval learning-rate schedulers advance once per server step crossed (``frequency``
respected), so that the rate a push carries is the one DDP would use at that step. At a
synchronization every worker holds the same count; between them each worker's is the count of the
parameters it last pulled. Loggers follow it too (``log_every_n_steps`` and the step logged values
are written at). ``max_steps`` counts server steps (the server stops there).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer import call


class ServerSteps:
    """Keeps this worker's Lightning step counters at ``base + `` the server's steps (see the module doc).

    Args:
        trainer: the fitting trainer (its training loop's scheduler updates are taken over for
            non-plateau step-interval schedulers).
        base: the steps taken before this fit (a resumed checkpoint's ``global_step``).
    """

    def __init__(self, trainer: pl.Trainer, base: int = 0) -> None:
        self.trainer, self.base = trainer, int(base)
        self.loop = trainer.fit_loop.epoch_loop
        self.updates = self.scheduled = self.base
        lightning_update = type(self.loop).update_lr_schedulers.__get__(self.loop)

        def update_lr_schedulers(interval: str, update_plateau_schedulers: bool) -> None:
            if interval == "step" and not update_plateau_schedulers:
                self.after_batch()  # right after each batch's optimizer step, where Lightning steps them
                return
            lightning_update(interval, update_plateau_schedulers)

        self.loop.update_lr_schedulers = update_lr_schedulers

    def server_at(self, version: int) -> None:
        """The server has taken ``version`` steps (in this fit), as a reply just said."""
        self.updates = max(self.updates, self.base + int(version))

    def after_batch(self) -> None:
        """After a training batch: the counters and schedulers at the server's count (the loggers' step
        counter is one short: Lightning adds the batch's one right after)."""
        self.synchronized()
        self.loop._batches_that_stepped = self.updates - 1

    def synchronized(self) -> None:
        """``global_step`` at the server's count, schedulers advanced for every step crossed."""
        step = self.loop.automatic_optimization.optim_progress.optimizer.step.total
        step.ready = step.completed = self.updates
        for update in range(self.scheduled + 1, self.updates + 1):
            for config in self.trainer.lr_scheduler_configs:
                if config.interval == "step" and not config.reduce_on_plateau and update % config.frequency == 0:
                    self.loop.scheduler_progress.increment_ready()
                    call._call_lightning_module_hook(self.trainer, "lr_scheduler_step", config.scheduler, None)
                    self.loop.scheduler_progress.increment_completed()
        self.scheduled = self.updates

    def remove(self) -> None:
        """Lightning's own scheduler updates again (after the fit)."""
        vars(self.loop).pop("update_lr_schedulers", None)


def restored_global_step(trainer: pl.Trainer) -> int:
    """The ``global_step`` of the checkpoint this fit resumes from (0 when it starts afresh); known
    from strategy ``setup`` on, before Lightning restores the loops."""
    checkpoint: dict[str, Any] | None = getattr(trainer._checkpoint_connector, "_loaded_checkpoint", None)
    return int(checkpoint.get("global_step", 0)) if checkpoint else 0
