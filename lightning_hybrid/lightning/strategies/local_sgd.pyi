# Generated from lightning_hybrid/strategies/local_sgd.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
from collections.abc import Callable
from typing import Any
import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from lightning_hybrid.comm.local_sgd import LocalSGD, validate
from lightning_hybrid.lightning.strategies import common
from lightning_hybrid.lightning.strategies.even_batches import EvenBatches, even_batches
from lightning_hybrid.lightning.strategies.meeting import Agreement, Carried, EveryBatch
from lightning_hybrid.strategies.rank_states import RankStates

class LocalSGDStrategy(RankStates, common.UnwrappedDDPStrategy):
    strategy_name = ...
    rank_states_key = ...
    aliases = ...
    resumes_mid_epoch = ...

    def __init__(self, sync_every: int=32, delay: int=0, outer_optimizer: str='average', outer_lr: float=0.7, outer_momentum: float=0.9, fragments: int=1, wire_dtype: str='fp32', **kwargs: Any) -> None:
        ...

    def check_trainer(self, trainer: pl.Trainer, model: pl.LightningModule | None) -> None:
        ...

    def stop_agreement(self, trainer: pl.Trainer) -> Agreement:
        ...

    def setup(self, trainer: pl.Trainer) -> None:
        ...

    def on_sync_start(self, trainer: pl.Trainer) -> None:
        ...

    def on_epoch_start(self, trainer: pl.Trainer) -> None:
        ...

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        ...

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any=None, **kwargs: Any) -> Any:
        ...

    def sync_point(self) -> None:
        ...

    def on_sync_end(self) -> None:
        ...

    def ranks_differ(self) -> bool:
        ...

    def shared_state(self) -> Any:
        ...

    def teardown(self) -> None:
        ...
