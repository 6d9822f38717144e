"""How a fit was stopped (a signal, a preemption): where, the checkpoint a rerun resumes from, and the one
line that says so (plain: :mod:`lightning_hybrid.preemption` stops the fit and saves the checkpoint)."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path


#: The name of the mid-epoch checkpoint, in the checkpoint folder.
CHECKPOINT_NAME = "last-interrupted.ckpt"


#: The checkpoint kept at each epoch's end under a strategy that cannot resume mid-epoch.
EPOCH_END_NAME = "last-epoch-end.ckpt"



@dataclass
class Stop:
    """How a fit was stopped: the signal, where (epoch, batches of it done), the checkpoint a rerun
    resumes from (None: none yet), whether it continues the epoch, the SLURM job requeued."""

    signal: str
    epoch: int = 0  # Lightning's current_epoch (from 0); the line says it from 1, as the progress line does
    batches_done: int = 0
    batches: int | float = 0
    checkpoint: Path | None = None
    mid_epoch: bool = False
    requeued: str | None = None
    strategy: str = ""

    #: Nothing had been trained when the stop came (set-up, the sanity check, the first batch).
    before_training: bool = False

    @property
    def exit_code(self) -> int:
        return 128 + int(signal.Signals[self.signal])

    def summary(self) -> str:
        """The one line that says what stopped the run and where it continues."""
        of = f" of {self.batches}" if self.batches != float("inf") else ""
        where = f"epoch {self.epoch + 1} after {self.batches_done}{of} batches"  # counted from 1, as the progress line
        if self.before_training:
            return (f"stopped by {self.signal} before any training (set-up or the sanity check): nothing to save; "
                    "run the same command again to start over")
        if self.checkpoint is None:
            resume = "no checkpoint was saved before it (a rerun starts afresh)"
        elif self.mid_epoch:
            resume = f"checkpoint {self.checkpoint} (a rerun continues the epoch)"
        else:
            resume = (f"checkpoint {self.checkpoint} (from the end of the previous epoch: {self.strategy} keeps no "
                      "mid-epoch state, so a rerun repeats this epoch)")
        then = (f"SLURM job {self.requeued} requeued; it resumes from there" if self.requeued
                else "run the same command again to resume (ckpt_path=auto)")
        return f"stopped by {self.signal} in {where}: {resume}; {then}"
