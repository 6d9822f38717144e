# Generated from lightning_hybrid/strategies/meeting.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import signal
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol
import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning_hybrid.comm.collectives import Pending, all_gather, all_reduce_, start_all_reduce, unchecked_group
EVALUATION_STRIDE = ...
_HOOK = ...
_NOTIFIER = ...

def _distributed(trainer: pl.Trainer) -> bool:
    ...

class Agreement(Protocol):

    def __call__(self, requested: int) -> int:
        ...

class EveryBatch:

    def __call__(self, requested: int) -> int:
        ...

class Deferred:

    def __init__(self, lag: int=1) -> None:
        ...

    def __call__(self, requested: int) -> int:
        ...

class Carried:

    def __init__(self) -> None:
        ...

    def __call__(self, requested: int) -> int:
        ...

    def heard(self, signum: int) -> None:
        ...

class ThroughServer:

    def __init__(self, tell: Callable[[int], None]) -> None:
        ...

    def __call__(self, requested: int) -> int:
        ...

class BatchMeeting:

    def __init__(self, trainer: pl.Trainer) -> None:
        ...

    @property
    def trainer(self) -> pl.Trainer:
        ...

    def attach(self) -> BatchMeeting:
        ...

    def detach(self) -> None:
        ...

    def agree_by(self, agreement: Agreement) -> None:
        ...

    def observe(self, observer: Callable[[float], None]) -> None:
        ...

    def forget(self, observer: Callable[[float], None]) -> None:
        ...

    def request_stop(self, signum: int=signal.SIGTERM) -> None:
        ...

    def _on_lightning_sigterm(self, signum: int, frame: Any) -> None:
        ...

    def __call__(self) -> None:
        ...

    def _at_step_boundary(self) -> bool:
        ...

    def _stop(self) -> None:
        ...

    def stop_now(self, signum: int) -> None:
        ...

    def evaluation_starts(self, batches: Any) -> None:
        ...

    def agree_in_evaluation(self) -> None:
        ...

    def evaluation_ends(self) -> None:
        ...

    @property
    def agreed_signal(self) -> str | None:
        ...
_MEETINGS: weakref.WeakKeyDictionary[pl.Trainer, BatchMeeting] = ...

def meeting(trainer: pl.Trainer) -> BatchMeeting:
    ...
