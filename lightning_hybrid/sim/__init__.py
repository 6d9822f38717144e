"""Heterogeneity simulation in plain Python: slowed work and transient stragglers on one machine.

The Lightning callback that applies it to training is :class:`lightning_hybrid.callbacks.HeterogeneitySimulator`.
"""

from lightning_hybrid.sim.slowdown import StepStretcher, stretch

__all__ = ["StepStretcher", "stretch"]
