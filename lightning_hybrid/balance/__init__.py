"""Throughput-balanced synchronous data parallelism, in plain torch (no Lightning).

Each rank trains on a share of a fixed global batch proportional to its speed, and the gradients
are summed weighted by the shares, so one step is one step of single-process SGD on the global
batch while no rank waits long for a slower one. One concept per module:

- :mod:`~lightning_hybrid.balance.shares`: shares from speeds (largest-remainder rounding, ``min_share``).
- :mod:`~lightning_hybrid.balance.schedule`: the shares in force at each step, and where a change
  decided now may take effect although samplers deal batches ahead.
- :mod:`~lightning_hybrid.balance.sampler`: the batch sampler that deals each rank its slice of every
  global batch of the epoch's seeded permutation.
- :mod:`~lightning_hybrid.balance.speeds`: measured samples per second of a rank's own time, smoothed.
- :mod:`~lightning_hybrid.balance.hook`: the DDP communication hook that sums the weighted gradients
  and the clock of a rank's cycle: its own time (everything between two all-reduces) and its wait.

The Lightning glue is :class:`lightning_hybrid.strategies.balanced.BalancedDataParallelStrategy`.
"""

from lightning_hybrid.balance.hook import CycleClock, timed_sum_hook
from lightning_hybrid.balance.sampler import BalancedBatchSampler, Dealt
from lightning_hybrid.balance.schedule import ShareSchedule, Step, agreed_start
from lightning_hybrid.balance.shares import apportion, check_global_batch, check_speeds, step_time, worth_changing
from lightning_hybrid.balance.speeds import Meter, SpeedEstimator

__all__ = [
    "BalancedBatchSampler",
    "CycleClock",
    "Dealt",
    "Meter",
    "ShareSchedule",
    "SpeedEstimator",
    "Step",
    "agreed_start",
    "apportion",
    "step_time",
    "worth_changing",
    "check_global_batch",
    "check_speeds",
    "timed_sum_hook",
]
