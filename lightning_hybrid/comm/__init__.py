"""Communication between workers in plain torch.distributed, testable without a Trainer.

* :mod:`~lightning_hybrid.comm.collectives`: which device each process group's tensors live on, and
  every collective the package issues.
* :mod:`~lightning_hybrid.comm.delayed_allreduce`: bucketed all-reduce in the background, handed back a
  fixed number of steps later, with optional delay compensation (Pipe-SGD, DC-ASGD): the exchange of
  DelayedAveragingStrategy and of the hybrid strategy's data-parallel dimension.
* :mod:`~lightning_hybrid.comm.delayed_averaging`: delayed gradient averaging over that exchange (each
  rank's own gradient at once, corrected by the average later): DelayedAveragingStrategy's default method.
* :mod:`~lightning_hybrid.comm.outer_rounds`: local SGD with an outer optimizer (DiLoCo), streamed.
* :mod:`~lightning_hybrid.comm.stop_signal`: a stop request carried in an exchange's buffer.
* :mod:`~lightning_hybrid.comm.flat`: parameters and gradients as one flat buffer.

The parameter server has a package of its own: :mod:`lightning_hybrid.parameter_server`.
"""

from lightning_hybrid.comm.delayed_allreduce import DelayedAllReduce
from lightning_hybrid.comm.delayed_averaging import DelayedGradientAveraging

__all__ = ["DelayedAllReduce", "DelayedGradientAveraging"]
