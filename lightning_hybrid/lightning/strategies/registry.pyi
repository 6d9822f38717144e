# Generated from lightning_hybrid/strategies/registry.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
import sys
from functools import partial
from typing import Any
from lightning.pytorch.strategies import StrategyRegistry
from lightning_hybrid.lightning import namespace
from lightning_hybrid.lightning.strategies.allreduce_asgd import AllReduceASGDStrategy
from lightning_hybrid.lightning.strategies.balanced import BalancedDataParallelStrategy
from lightning_hybrid.lightning.strategies.cneural import CNeuralStrategy
from lightning_hybrid.lightning.strategies.fsdp2 import FullyShardedStrategy
from lightning_hybrid.lightning.strategies.hybrid import HybridParallelStrategy
from lightning_hybrid.lightning.strategies.local_sgd import LocalSGDStrategy
from lightning_hybrid.lightning.strategies.partitioned_inference import PartitionedInferenceStrategy
from lightning_hybrid.lightning.strategies.ssp import SSPStrategy
_ALIASED = ...

def _lightning_flavour(strategy: type, **init_params: Any) -> Any:
    ...

def _register_lightning_flavours(strategies_module: Any) -> None:
    ...
