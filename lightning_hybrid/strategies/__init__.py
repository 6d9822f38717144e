"""Lightning strategies of the suite (Lightning glue only; the algorithms live in ``comm/`` and friends).

Importing this package registers each strategy's string aliases with Lightning's
``StrategyRegistry`` (``import lightning_hybrid`` does so): ``"ssp"``, ``"ssp_bounded"``,
``"ssp_async"``, ``"allreduce_asgd"``, ``"allreduce_asgd_dc"``, ``"hybrid"``. Planned:
``PartitionedInferenceStrategy`` ("partitioned_inference"); see the README's table.
"""

from pytorch_lightning.strategies import StrategyRegistry

from lightning_hybrid.strategies.allreduce_asgd import AllReduceASGDStrategy
from lightning_hybrid.strategies.hybrid import HybridParallelStrategy
from lightning_hybrid.strategies.ssp import ServerSampler, SSPStrategy

SSPStrategy.register_strategies(StrategyRegistry)
AllReduceASGDStrategy.register_strategies(StrategyRegistry)
HybridParallelStrategy.register_strategies(StrategyRegistry)

__all__ = ["AllReduceASGDStrategy", "HybridParallelStrategy", "SSPStrategy", "ServerSampler"]
