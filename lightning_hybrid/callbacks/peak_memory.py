"""Peak memory: each rank's largest allocation of a run, logged."""

from __future__ import annotations


import pytorch_lightning as pl
import torch

from lightning_hybrid.devices import PeakMemory, held_bytes
from lightning_hybrid.strategies.capabilities import capabilities_of


class PeakMemoryMonitor(pl.Callback):
    """Logs each rank's peak memory in training at each training epoch's end, under any strategy: above what
    it held when training started (after the data's preparation), less its model's parameters and buffers
    and its optimizer's state, which the peak counts: ``memory/rank<r>_peak_MiB`` (every rank's value gathered, so
    rank 0's loggers have them all). CUDA: ``max_memory_allocated``; CPU: the peak resident set
    (:class:`~lightning_hybrid.devices.PeakMemory`). The hybrid strategy logs the same keys, beside its
    plan's estimates, by itself.

    Example::

        >>> monitor = PeakMemoryMonitor()   # pl.Trainer(callbacks=[monitor]); CLI: callbacks=[...,peak_memory]
    """

    def __init__(self) -> None:
        self._peak: PeakMemory | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._peak is None:
            self._peak = PeakMemory(trainer.strategy.root_device)
            self._peak.start(resident=held_bytes(trainer.strategy.root_device, pl_module, *trainer.optimizers))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if capabilities_of(trainer.strategy).logs_peak_memory:
            return
        peak = self._peak.peak() if self._peak is not None else None
        # Every rank gathers, one without a measurement too (a NaN, not logged): a rank that returned
        # early would leave the others waiting in the gather. On the rank's device: NCCL gathers CUDA tensors only.
        mine = float("nan") if peak is None else peak / 2**20
        peaks = trainer.strategy.all_gather(torch.tensor([mine], dtype=torch.float64, device=trainer.strategy.root_device))
        for rank, value in enumerate(peaks.reshape(-1).tolist()):
            if value == value:  # not NaN
                pl_module.log(f"memory/rank{rank}_peak_MiB", value, sync_dist=True)  # the same on every rank
