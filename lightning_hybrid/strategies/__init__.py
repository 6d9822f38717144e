"""Lightning strategies of the suite (Lightning glue only; the algorithms live in ``comm/``,
``parameter_server/``, ``pipeline/``, ``placement/``, ``partition/`` and ``balance/``).

Importing this package registers each strategy's string aliases with Lightning's
``StrategyRegistry`` (``import lightning_hybrid`` does so): ``"ssp"``, ``"ssp_bounded"``,
``"ssp_async"``, ``"cneural"``, ``"allreduce_asgd"``, ``"allreduce_asgd_dc"``, ``"hybrid"``,
``"partitioned_inference"``, ``"balanced"``.
"""

from pytorch_lightning.strategies import StrategyRegistry

from lightning_hybrid.strategies.allreduce_asgd import AllReduceASGDStrategy
from lightning_hybrid.strategies.balanced import BalancedDataParallelStrategy
from lightning_hybrid.strategies.cneural import CNeuralStrategy
from lightning_hybrid.strategies.hybrid import HybridParallelStrategy
from lightning_hybrid.strategies.parameter_server import ParameterServerStrategy
from lightning_hybrid.strategies.partitioned_inference import PartitionedInferenceStrategy
from lightning_hybrid.strategies.ssp import ServerSampler, SSPStrategy

for _strategy in (
    SSPStrategy, CNeuralStrategy, AllReduceASGDStrategy, HybridParallelStrategy, PartitionedInferenceStrategy,
    BalancedDataParallelStrategy,
):
    _strategy.register_strategies(StrategyRegistry)

__all__ = [
    "AllReduceASGDStrategy",
    "BalancedDataParallelStrategy",
    "CNeuralStrategy",
    "HybridParallelStrategy",
    "ParameterServerStrategy",
    "PartitionedInferenceStrategy",
    "SSPStrategy",
    "ServerSampler",
]
