"""Communication algorithms in plain torch.distributed, testable without a Trainer.

* :mod:`~lightning_hybrid.comm.sync_controller`: the staleness rules (BSP, delay, bounded, async).
* :mod:`~lightning_hybrid.comm.chunks`: dynamic hand-out of an epoch's batches.
* :mod:`~lightning_hybrid.comm.parameter_server` / :mod:`~lightning_hybrid.comm.worker_client`:
  the parameter server process and the workers' end of its protocol, over
  :mod:`~lightning_hybrid.comm.channel`.
"""
