# Generated from lightning_hybrid/callbacks/__init__.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from typing import TYPE_CHECKING
from lightning_hybrid.lazy_exports import lazy_exports
from lightning_hybrid.lightning.callbacks.csv_log import ContinueCSVLog
from lightning_hybrid.lightning.callbacks.memory import PeakMemoryMonitor
from lightning_hybrid.lightning.callbacks.memory_budget import MemoryBudget, MemoryBudgetExceeded
from lightning_hybrid.lightning.callbacks.progress import ProgressLog
from lightning_hybrid.lightning.callbacks.simulator import CALIBRATION_STEPS, HeterogeneitySimulator
from lightning_hybrid.lightning.callbacks.timing import EpochTimer
from lightning_hybrid.lightning.callbacks.transfer_weights import TransferWeights
LAZY = ...
__all__ = sorted(LAZY)
