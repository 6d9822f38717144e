"""lightning-hybrid: PyTorch Lightning strategies for distributed training on heterogeneous hardware.

Pass one of the strategies to a ``pytorch_lightning.Trainer`` (or its alias: ``strategy="ssp_delay"``);
:class:`ClassifierModule` wraps any classification network for them. ``__version__`` is the
installed release. With ``import lightning as L``, the same names are in :mod:`lightning_hybrid.lightning`
(generated: :mod:`lightning_hybrid.namespace`).

Examples:
    >>> import importlib.metadata
    >>> import lightning_hybrid
    >>> lightning_hybrid.__version__ == importlib.metadata.version("lightning-hybrid")
    True
    >>> [name for name in lightning_hybrid.__all__ if name.endswith("Strategy")][:2]
    ['BalancedDataParallelStrategy', 'CNeuralStrategy']
"""

from lightning_hybrid import namespace as _namespace
from lightning_hybrid.deprecation import renamed as _renamed

if _namespace.BASE == "pytorch_lightning" or __name__ != _namespace.PACKAGE:
    from lightning_hybrid.classifier import ClassifierModule
    from lightning_hybrid.strategies import (
        BalancedDataParallelStrategy,
        CNeuralStrategy,
        DelayedAveragingStrategy,
        FullyShardedStrategy,
        HybridParallelStrategy,
        LocalSGDStrategy,
        PartitionedInferenceStrategy,
        SSPStrategy,
    )
    from lightning_hybrid.strategies import registry as _registry  # the aliases: Trainer(strategy="ssp_delay")
else:  # only `lightning` is installed: this package's names are its lightning flavour's (generated), bound
    # without an import statement, so that static readers (type checkers, the API page) see one binding of each
    import importlib

    _flavour = importlib.import_module(f"{_namespace.PACKAGE}.lightning")
    globals().update({name: getattr(_flavour, name) for name in (
        "BalancedDataParallelStrategy", "ClassifierModule", "CNeuralStrategy", "DelayedAveragingStrategy",
        "FullyShardedStrategy", "HybridParallelStrategy", "LocalSGDStrategy", "PartitionedInferenceStrategy", "SSPStrategy")})

__version__ = "0.1.0"

#: Old names, kept for a release: each warns, naming the new one (:mod:`lightning_hybrid.deprecation`).
RENAMED = {"AllReduceASGDStrategy": "lightning_hybrid.strategies.delayed_averaging_strategy:DelayedAveragingStrategy"}
__getattr__ = _renamed(globals(), RENAMED)

__all__ = [
    "BalancedDataParallelStrategy",
    "CNeuralStrategy",
    "ClassifierModule",
    "DelayedAveragingStrategy",
    "FullyShardedStrategy",
    "HybridParallelStrategy",
    "LocalSGDStrategy",
    "PartitionedInferenceStrategy",
    "SSPStrategy",
    "__version__",
]
