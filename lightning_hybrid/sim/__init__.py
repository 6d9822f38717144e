"""Heterogeneity simulation: slow ranks and transient stragglers on one machine."""

from lightning_hybrid.sim.slowdown import HeterogeneitySimulator, StepStretcher

__all__ = ["HeterogeneitySimulator", "StepStretcher"]
