"""The parameter server in plain torch.distributed, testable without a Trainer.

* :mod:`~lightning_hybrid.parameter_server.protocol`: typed requests and replies, the server's settings.
* :mod:`~lightning_hybrid.parameter_server.channel`: the side channel (a gloo group of its own, CPU tensors).
* :mod:`~lightning_hybrid.parameter_server.server`: the server process (optimizer, parameters, data).
* :mod:`~lightning_hybrid.parameter_server.shared_memory`: gradients and parameters through /dev/shm on one host.
* :mod:`~lightning_hybrid.parameter_server.client`: the workers' end of the protocol.
* :mod:`~lightning_hybrid.parameter_server.sharding`: the parameters split over several server processes.
* :mod:`~lightning_hybrid.parameter_server.sync_controller`: the staleness rules (BSP, delay, bounded, async).
* :mod:`~lightning_hybrid.parameter_server.update_rule`: pushes into optimizer steps;
  :mod:`~lightning_hybrid.parameter_server.gradient_mask`: only the parameters that had a gradient are stepped;
  :mod:`~lightning_hybrid.parameter_server.step_settings`: the hyperparameters each push brings
  (:mod:`~lightning_hybrid.parameter_server.hyperparameters`) and the clip of the averaged gradient
  (:mod:`~lightning_hybrid.parameter_server.average_clip`).
* :mod:`~lightning_hybrid.parameter_server.dispenser`: handing out an epoch's batches on request.
* :mod:`~lightning_hybrid.parameter_server.server_launch`: the servers seen from the workers: settings, processes, clients.
* :mod:`~lightning_hybrid.parameter_server.epoch_stats`: a worker's figures of an epoch, gathered for logging.

The Lightning strategies on top are :class:`~lightning_hybrid.SSPStrategy` and
:class:`~lightning_hybrid.CNeuralStrategy` (:mod:`lightning_hybrid.strategies.parameter_server`).
"""
