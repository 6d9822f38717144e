"""The suite's launcher: Lightning's subprocess launcher that refuses, before any other process starts, a run the
strategy cannot do, and watches the processes it starts."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.distributed import _set_num_threads_if_needed
from pytorch_lightning.strategies.launchers import _SubprocessScriptLauncher
from pytorch_lightning.trainer.states import TrainerFn

from lightning_hybrid.strategies.forked_ranks import fork_ranks
from lightning_hybrid.strategies.rank_exit_watch import LAUNCHER_PID_ENV, RankExitWatch


class CheckingLauncher(_SubprocessScriptLauncher):
    """Lightning's subprocess launcher that first calls ``strategy.check_trainer(trainer, model)``
    (fitting) or ``strategy.check_evaluation(trainer, model)`` (validate, test, predict; when the
    strategy has it), so that a run the strategy cannot do fails before any other process starts,
    and that watches the processes it starts with a :class:`~lightning_hybrid.strategies.rank_exit_watch.RankExitWatch`
    (``self.watch``) instead of Lightning's observer."""

    def __init__(self, strategy: Any, *args: Any) -> None:
        super().__init__(*args)
        self.strategy = strategy
        self.watch: RankExitWatch | None = None

    def launch(self, function: Callable, *args: Any, trainer: pl.Trainer | None = None, **kwargs: Any) -> Any:
        model = args[0] if args and isinstance(args[0], pl.LightningModule) else None
        self.strategy.check_devices()
        if trainer is not None and trainer.state.fn == TrainerFn.FITTING:
            self.strategy.check_trainer(trainer, model)
            # fit(model, train_dataloaders, ...): a loader given directly is checked here; one a
            # datamodule builds exists only after its setup, on each rank (process_dataloader checks it).
            if len(args) > 1 and isinstance(args[1], torch.utils.data.DataLoader):
                self.strategy.check_training_data(args[1])
        elif trainer is not None:
            self.strategy.check_evaluation(trainer, model)
        # Lightning's launch, with our watch in place of its observer.
        self.cluster_environment.validate_settings(num_devices=self.num_processes, num_nodes=self.num_nodes)
        if not self.cluster_environment.creates_processes_externally:
            os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
            if self.strategy.forks_ranks:
                if self._fork_children():  # this is a forked rank: it trains, as a re-run script would
                    _set_num_threads_if_needed(num_processes=self.num_processes)
                    return function(*args, **kwargs)
                self.strategy.on_ranks_forked()
            else:
                self._call_children_scripts()
            self.watch = RankExitWatch()
            first_rank = self.cluster_environment.node_rank() * self.num_processes
            for local_rank, process in enumerate(self.procs, start=1):
                self.watch.add(self.strategy.process_role, first_rank + local_rank, process,
                               fatal=self.strategy.worker_loss_is_fatal)
            self.watch.start()
        _set_num_threads_if_needed(num_processes=self.num_processes)
        return function(*args, **kwargs)

    def _fork_children(self) -> int:
        """Start the other local ranks by forking (``fork_ranks=True``), with the environment Lightning
        gives re-run scripts; returns this process's local rank."""
        self._check_can_spawn_children()
        os.environ["MASTER_ADDR"] = self.cluster_environment.main_address
        os.environ["MASTER_PORT"] = str(self.cluster_environment.main_port)
        os.environ["NODE_RANK"] = str(self.cluster_environment.node_rank())
        os.environ["LOCAL_RANK"] = str(self.cluster_environment.local_rank())
        os.environ["WORLD_SIZE"] = f"{self.num_processes * self.num_nodes}"
        local_rank, self.procs = fork_ranks(self.num_processes)
        return local_rank
