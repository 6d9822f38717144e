"""lightning-hybrid: PyTorch Lightning strategies for distributed training on heterogeneous hardware."""

from lightning_hybrid.classifier import ClassifierModule
from lightning_hybrid.strategies import (
    AllReduceASGDStrategy,
    BalancedDataParallelStrategy,
    CNeuralStrategy,
    HybridParallelStrategy,
    PartitionedInferenceStrategy,
    SSPStrategy,
)

__version__ = "0.1.0"

__all__ = [
    "AllReduceASGDStrategy",
    "BalancedDataParallelStrategy",
    "CNeuralStrategy",
    "ClassifierModule",
    "HybridParallelStrategy",
    "PartitionedInferenceStrategy",
    "SSPStrategy",
    "__version__",
]
