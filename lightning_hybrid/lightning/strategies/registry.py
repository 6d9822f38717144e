# Generated from lightning_hybrid/strategies/registry.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""The strategies' string aliases (``"ssp_delay"``, ``"ssp_bounded"``, ``"ssp_async"``, ``"cneural"``,
``"delayed_averaging"``, ``"delayed_averaging_dc"``, ``"local_sgd"``, ``"hybrid"``, ``"partitioned_inference"``,
``"balanced"``, ``"fsdp2"``, ``"fsdp2_shard_grad_op"``, and for a release the renamed ``"ssp"``, ``"allreduce_asgd"``,
``"allreduce_asgd_dc"``, which warn) registered with Lightning's ``StrategyRegistry`` when this module is imported (``import
lightning_hybrid`` does so). Where ``lightning`` is imported already, the aliases are registered with
``lightning.pytorch``'s registry too, naming this package's ``lightning`` flavour
(:mod:`lightning_hybrid.namespace`); ``import lightning_hybrid.lightning`` registers them there in any order.
"""

import sys
from functools import partial
from typing import Any

from lightning.pytorch.strategies import StrategyRegistry

from lightning_hybrid.lightning import namespace
from lightning_hybrid.lightning.strategies.delayed_averaging_strategy import DelayedAveragingStrategy
from lightning_hybrid.lightning.strategies.balanced import BalancedDataParallelStrategy
from lightning_hybrid.lightning.strategies.cneural import CNeuralStrategy
from lightning_hybrid.lightning.strategies.fsdp2 import FullyShardedStrategy
from lightning_hybrid.lightning.strategies.hybrid import HybridParallelStrategy
from lightning_hybrid.lightning.strategies.local_sgd import LocalSGDStrategy
from lightning_hybrid.lightning.strategies.partitioned_inference import PartitionedInferenceStrategy
from lightning_hybrid.lightning.strategies.ssp import SSPStrategy

_ALIASED = (SSPStrategy, CNeuralStrategy, DelayedAveragingStrategy, HybridParallelStrategy, PartitionedInferenceStrategy,
            BalancedDataParallelStrategy, LocalSGDStrategy, FullyShardedStrategy)
for _strategy in _ALIASED:
    _strategy.register_strategies(StrategyRegistry)


def _lightning_flavour(strategy: type, **init_params: Any) -> Any:
    return namespace.mirrored(strategy)(**init_params)


def _register_lightning_flavours(strategies_module: Any) -> None:
    """``lightning.pytorch``'s registry: each alias builds the ``lightning`` flavour, imported on first use."""
    for strategy in _ALIASED:
        for name, factory, description, init_params in strategy.registry_entries(partial(_lightning_flavour, strategy)):
            strategies_module.StrategyRegistry.register(name, factory, description=description, override=True,
                                                        **init_params)


# In this package only (not in its lightning flavour, whose own registrations above are lightning.pytorch's):
# where `lightning` is imported already, its Trainer gets the aliases too, naming the lightning flavour.
if not __name__.startswith(namespace.MIRROR) and "lightning.pytorch.strategies" in sys.modules:
    _register_lightning_flavours(sys.modules["lightning.pytorch.strategies"])
