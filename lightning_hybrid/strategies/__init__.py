"""Lightning strategies of the suite (Lightning glue only; the algorithms live in ``comm/``,
``parameter_server/``, ``pipeline/``, ``placement/``, ``partition/`` and ``balance/``).

``import lightning_hybrid`` registers each strategy's string aliases with Lightning's ``StrategyRegistry``
(:mod:`lightning_hybrid.strategies.registry`). The names below are imported on first use (PEP 562), so
that the plain modules here (``capabilities``, ``forked_ranks``, ``rank_exit_watch``, ``rank_states``)
import no Lightning and are one module under both Lightning namespaces.
"""

from typing import TYPE_CHECKING

from lightning_hybrid.deprecation import renamed
from lightning_hybrid.lazy_exports import lazy_exports

if TYPE_CHECKING:  # the names for type checkers; at run time, __getattr__ below imports them
    from lightning_hybrid.strategies.balanced import BalancedDataParallelStrategy
    from lightning_hybrid.strategies.cneural import CNeuralStrategy
    from lightning_hybrid.strategies.delayed_averaging_strategy import DelayedAveragingStrategy
    from lightning_hybrid.strategies.fsdp2 import FullyShardedStrategy
    from lightning_hybrid.strategies.hybrid import HybridParallelStrategy
    from lightning_hybrid.strategies.local_sgd import LocalSGDStrategy
    from lightning_hybrid.strategies.parameter_server import ParameterServerStrategy
    from lightning_hybrid.strategies.partitioned_inference import PartitionedInferenceStrategy
    from lightning_hybrid.strategies.ssp import ServerSampler, SSPStrategy

#: Each name this package exports, and the module that defines it.
LAZY = {
    "BalancedDataParallelStrategy": "lightning_hybrid.strategies.balanced",
    "CNeuralStrategy": "lightning_hybrid.strategies.cneural",
    "DelayedAveragingStrategy": "lightning_hybrid.strategies.delayed_averaging_strategy",
    "FullyShardedStrategy": "lightning_hybrid.strategies.fsdp2",
    "HybridParallelStrategy": "lightning_hybrid.strategies.hybrid",
    "LocalSGDStrategy": "lightning_hybrid.strategies.local_sgd",
    "ParameterServerStrategy": "lightning_hybrid.strategies.parameter_server",
    "PartitionedInferenceStrategy": "lightning_hybrid.strategies.partitioned_inference",
    "SSPStrategy": "lightning_hybrid.strategies.ssp",
    "ServerSampler": "lightning_hybrid.strategies.ssp",
}

__all__ = sorted(LAZY)

#: Old names, kept for a release: each warns, naming the new one (:mod:`lightning_hybrid.deprecation`).
RENAMED = {"AllReduceASGDStrategy": "lightning_hybrid.strategies.delayed_averaging_strategy:DelayedAveragingStrategy"}

_exported, __dir__ = lazy_exports(globals(), LAZY)
__getattr__ = renamed(globals(), RENAMED, others=_exported)
