"""Heterogeneity simulation in plain Python: slowed work, transient stragglers and real CPU contention
on one machine.

The Lightning callback that applies it to training is :class:`lightning_hybrid.callbacks.HeterogeneitySimulator`.
"""

from lightning_hybrid.sim.contention import Competitor, check_cores
from lightning_hybrid.sim.cpu_share import CpuShare
from lightning_hybrid.sim.slowdown import WHERE, SlowBatches, StepStretcher, check_where, stretch

__all__ = ["WHERE", "Competitor", "CpuShare", "SlowBatches", "StepStretcher", "check_cores", "check_where", "stretch"]
