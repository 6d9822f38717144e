"""Communication between workers in plain torch.distributed, testable without a Trainer.

* :mod:`~lightning_hybrid.comm.collectives`: which device each process group's tensors live on, and
  every collective the package issues.
* :mod:`~lightning_hybrid.comm.delayed_allreduce`: bucketed all-reduce in the background, applied a
  fixed number of steps later, with optional delay compensation (Pipe-SGD, DC-ASGD): the algorithm
  of AllReduceASGDStrategy and of the hybrid strategy's data-parallel dimension.
* :mod:`~lightning_hybrid.comm.flat`: parameters and gradients as one flat buffer.

The parameter server has a package of its own: :mod:`lightning_hybrid.parameter_server`.
"""

from lightning_hybrid.comm.delayed_allreduce import DelayedAllReduce

__all__ = ["DelayedAllReduce"]
