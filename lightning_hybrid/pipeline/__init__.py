"""Running a model's blocks as pipeline stages (used by :class:`~lightning_hybrid.HybridParallelStrategy`)."""

from lightning_hybrid.pipeline.mesh import Mesh
from lightning_hybrid.pipeline.protocol import pipeline_blocks, pipeline_inputs
from lightning_hybrid.pipeline.stage import StageModule

__all__ = ["Mesh", "StageModule", "pipeline_blocks", "pipeline_inputs"]
