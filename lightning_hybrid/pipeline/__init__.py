"""Pipeline parallelism in plain torch.distributed, testable without Lightning (used by
:class:`~lightning_hybrid.HybridParallelStrategy`).

* :mod:`~lightning_hybrid.pipeline.module_contract`: what a LightningModule implements to be pipelined.
* :mod:`~lightning_hybrid.pipeline.mesh`: the stages x replicas layout of ranks and its process groups.
* :mod:`~lightning_hybrid.pipeline.stage`: a stage's blocks, optionally slowed (simulated devices).
* :mod:`~lightning_hybrid.pipeline.schedules`: GPipe and 1F1B as lists of typed actions per stage.
* :mod:`~lightning_hybrid.pipeline.stage_executor`: one stage running its actions, messages between stages.
* :mod:`~lightning_hybrid.pipeline.parallel`: one rank's part of pipeline x data parallelism.
* :mod:`~lightning_hybrid.pipeline.stage_adoption`: a rank keeping its stage only (materialised, or the others freed).
"""

from lightning_hybrid.pipeline.mesh import Mesh
from lightning_hybrid.pipeline.parallel import PipelineParallel
from lightning_hybrid.pipeline.module_contract import pipeline_blocks, pipeline_inputs, pipeline_loss
from lightning_hybrid.pipeline.stage import StageModule

__all__ = ["Mesh", "PipelineParallel", "StageModule", "pipeline_blocks", "pipeline_inputs", "pipeline_loss"]
