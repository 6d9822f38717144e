# Generated from lightning_hybrid/__init__.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from lightning_hybrid.lightning import namespace as _namespace
from lightning_hybrid.lightning.classifier import ClassifierModule
from lightning_hybrid.lightning.strategies import AllReduceASGDStrategy, BalancedDataParallelStrategy, CNeuralStrategy, FullyShardedStrategy, HybridParallelStrategy, LocalSGDStrategy, PartitionedInferenceStrategy, SSPStrategy
from lightning_hybrid.lightning.strategies import registry as _registry
import importlib
_flavour = ...
__version__ = ...
__all__ = ['AllReduceASGDStrategy', 'BalancedDataParallelStrategy', 'CNeuralStrategy', 'ClassifierModule', 'FullyShardedStrategy', 'HybridParallelStrategy', 'LocalSGDStrategy', 'PartitionedInferenceStrategy', 'SSPStrategy', '__version__']
