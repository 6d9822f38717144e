# Generated from lightning_hybrid/watchdog.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""The watchdog: a run whose ranks stop making progress ends in seconds with every rank's stack.

    trainer = pl.Trainer(strategy="ssp_delay", devices=2, callbacks=[StallWatchdog(timeout_s=300)])   # the CLI adds it

:class:`StallWatchdog` beats its rank's :class:`~lightning_hybrid.comm.stall_watch.StallWatch` at every
batch and every hook of the training, validation, test and prediction loops. When a rank gets no
beat for ``timeout_s`` seconds (never less than ``slack`` times the longest gap between beats seen;
a parameter-server worker's waits for its server do not count, they have a timeout of their own, and
the limit stays below that timeout, ``strategy.peer_timeout_s``, after which the server would fail
and name a worker instead of the stall), every rank
writes its Python stack to the log and rank 0 ends the run with one message: where each rank waits,
and whether the ranks are out of step (a collective some ranks issued and the others did not) or all
wait for something outside them. The process that started the ranks stops them all; exit status 1.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from typing import Any

import lightning.pytorch as pl
import torch.distributed as dist

from lightning_hybrid.comm.board import Board
from lightning_hybrid.comm.stall_watch import StallWatch
from lightning_hybrid.deprecation import renamed
from lightning_hybrid.strategies.capabilities import capabilities_of

_SESSIONS = itertools.count()
#: The limit is at most this share of a peer's own timeout (the parameter server's), so that a stall
#: is reported as what it is before the peer gives up on the stalled rank.
PEER_SHARE = 0.8


def end_the_run(trainer: pl.Trainer, message: str) -> None:
    """Stop every process this one started, write ``message`` last, exit with status 1."""
    watch = capabilities_of(trainer.strategy).rank_exit_watch
    if watch is not None:
        watch.stop_all(message)  # does not return
    for process in getattr(trainer.strategy.launcher, "procs", None) or []:  # Lightning's launcher's ranks
        with contextlib.suppress(OSError):  # already gone
            process.kill()
    os.write(2, ("\n" + message + "\n").encode())
    os._exit(1)


class StallWatchdog(pl.Callback):
    """End a run whose ranks stopped making progress (see the module docstring).

    Args:
        timeout_s: seconds without progress on a rank that end the run (default 300; lowered to 80 % of
            the strategy's ``peer_timeout_s`` where that is shorter).
        slack: the limit is never below ``slack`` times the longest gap between two beats seen so far.
        setting: how the user sets ``timeout_s``, named in the final message.
    """

    def __init__(self, timeout_s: float = 300.0, slack: float = 10.0, setting: str | None = None) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive seconds, got {timeout_s}")
        self.timeout_s, self.slack = float(timeout_s), float(slack)
        self.setting = setting or f"StallWatchdog(timeout_s={timeout_s:g})"
        #: This rank's watch during a fit or test (None outside them).
        self.watch: StallWatch | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        distributed = trainer.world_size > 1 and dist.is_available() and dist.is_initialized()
        board = Board(f"lightning_hybrid/watchdog/{next(_SESSIONS)}/") if distributed else None
        limit = min(self.timeout_s, PEER_SHARE * float(capabilities_of(trainer.strategy).peer_timeout_s))
        self.watch = StallWatch(trainer.global_rank, trainer.world_size, limit, board,
                                end_run=lambda message: end_the_run(trainer, message), slack=self.slack,
                                setting=self.setting)
        self.watch.start()

    def _beat(self, *args: Any, **kwargs: Any) -> None:
        if self.watch is not None:
            self.watch.beat()

    # Every hook of the loops is a beat: a gap between two of them is one step of the run.
    on_sanity_check_start = on_sanity_check_end = on_train_start = on_train_end = _beat
    on_train_epoch_start = on_train_epoch_end = on_train_batch_start = on_train_batch_end = _beat
    on_validation_start = on_validation_end = on_validation_epoch_start = on_validation_epoch_end = _beat
    on_validation_batch_start = on_validation_batch_end = on_before_backward = on_after_backward = _beat
    on_before_optimizer_step = on_save_checkpoint = on_load_checkpoint = _beat
    on_test_start = on_test_end = on_test_epoch_start = on_test_epoch_end = on_test_batch_start = _beat
    on_test_batch_end = on_predict_start = on_predict_end = on_predict_batch_start = on_predict_batch_end = _beat

    def _stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()
            self.watch = None

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._stop()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._stop()


#: ``Watchdog``, its name until 2026-11-29: it watches for stalls, beside the launcher's
#: :class:`~lightning_hybrid.strategies.rank_exit_watch.RankExitWatch` (a rank that exits).
__getattr__ = renamed(globals(), {"Watchdog": "lightning_hybrid.lightning.watchdog:StallWatchdog"})
