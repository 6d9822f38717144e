"""Communication algorithms in plain torch.distributed, testable without a Trainer.

* :mod:`~lightning_hybrid.comm.sync_controller`: the staleness rules (BSP, delay, bounded, async).
* :mod:`~lightning_hybrid.comm.chunks`: dynamic hand-out of an epoch's batches.
* :mod:`~lightning_hybrid.comm.parameter_server` / :mod:`~lightning_hybrid.comm.worker_client`:
  the parameter server process and the workers' end of its protocol, over
  :mod:`~lightning_hybrid.comm.channel`.
* :mod:`~lightning_hybrid.comm.delayed_allreduce`: bucketed all-reduce in the background, applied
  a fixed number of steps later, with optional delay compensation (Pipe-SGD, DC-ASGD): the
  building block of the planned AllReduceASGDStrategy and of the hybrid strategy's data-parallel
  dimension.
"""
