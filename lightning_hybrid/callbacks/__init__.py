"""Lightning callbacks of the suite, one concept a module: epoch timing (``timing``), peak memory
(``peak_memory``), a memory budget checked before training (``memory_budget``), simulated heterogeneity (``simulator``), progress lines (``progress``), CSV logs continued
across spawned stages (``csv_log``) and weights transferred from another run (``transfer_weights``).

The names below are imported on first use (PEP 562), as in ``lightning_hybrid.data``.
"""

from typing import TYPE_CHECKING

from lightning_hybrid.lazy_exports import lazy_exports

if TYPE_CHECKING:  # the names for type checkers; at run time, __getattr__ below imports them
    from lightning_hybrid.callbacks.csv_log import ContinueCSVLog
    from lightning_hybrid.callbacks.peak_memory import PeakMemoryMonitor
    from lightning_hybrid.callbacks.memory_budget import MemoryBudget, MemoryBudgetExceeded
    from lightning_hybrid.callbacks.progress import ProgressLog
    from lightning_hybrid.callbacks.simulator import CALIBRATION_STEPS, HeterogeneitySimulator
    from lightning_hybrid.callbacks.timing import EpochTimer
    from lightning_hybrid.callbacks.transfer_weights import TransferWeights

#: Each name this package exports, and the module that defines it.
LAZY = {
    "CALIBRATION_STEPS": "lightning_hybrid.callbacks.simulator",
    "ContinueCSVLog": "lightning_hybrid.callbacks.csv_log",
    "EpochTimer": "lightning_hybrid.callbacks.timing",
    "HeterogeneitySimulator": "lightning_hybrid.callbacks.simulator",
    "MemoryBudget": "lightning_hybrid.callbacks.memory_budget",
    "MemoryBudgetExceeded": "lightning_hybrid.callbacks.memory_budget",
    "PeakMemoryMonitor": "lightning_hybrid.callbacks.peak_memory",
    "ProgressLog": "lightning_hybrid.callbacks.progress",
    "TransferWeights": "lightning_hybrid.callbacks.transfer_weights",
}

__all__ = sorted(LAZY)

__getattr__, __dir__ = lazy_exports(globals(), LAZY)
