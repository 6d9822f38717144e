# Generated from lightning_hybrid/strategies/__init__.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from typing import TYPE_CHECKING
from lightning_hybrid.lazy_exports import lazy_exports
from lightning_hybrid.lightning.strategies.allreduce_asgd import AllReduceASGDStrategy
from lightning_hybrid.lightning.strategies.balanced import BalancedDataParallelStrategy
from lightning_hybrid.lightning.strategies.cneural import CNeuralStrategy
from lightning_hybrid.lightning.strategies.fsdp2 import FullyShardedStrategy
from lightning_hybrid.lightning.strategies.hybrid import HybridParallelStrategy
from lightning_hybrid.lightning.strategies.local_sgd import LocalSGDStrategy
from lightning_hybrid.lightning.strategies.parameter_server import ParameterServerStrategy
from lightning_hybrid.lightning.strategies.partitioned_inference import PartitionedInferenceStrategy
from lightning_hybrid.lightning.strategies.ssp import ServerSampler, SSPStrategy
LAZY = ...
__all__ = sorted(LAZY)
