"""lightning-hybrid: PyTorch Lightning strategies for distributed training on heterogeneous hardware.

Pass one of the strategies to a ``pytorch_lightning.Trainer`` (or its alias: ``strategy="ssp"``);
:class:`ClassifierModule` wraps any classification network for them. ``__version__`` is the
installed release.

Examples:
    >>> import importlib.metadata
    >>> import lightning_hybrid
    >>> lightning_hybrid.__version__ == importlib.metadata.version("lightning-hybrid")
    True
    >>> [name for name in lightning_hybrid.__all__ if name.endswith("Strategy")][:2]
    ['AllReduceASGDStrategy', 'BalancedDataParallelStrategy']
"""

from lightning_hybrid import namespace as _namespace

_namespace.install()  # first: serves the glue against `lightning` where `pytorch_lightning` is missing

from lightning_hybrid.classifier import ClassifierModule  # noqa: E402
from lightning_hybrid.strategies import (  # noqa: E402
    AllReduceASGDStrategy,
    BalancedDataParallelStrategy,
    CNeuralStrategy,
    HybridParallelStrategy,
    LocalSGDStrategy,
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
    "LocalSGDStrategy",
    "PartitionedInferenceStrategy",
    "SSPStrategy",
    "__version__",
]
