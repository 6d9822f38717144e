"""Validation, test and predict steps that run the module's block sequence (``pipeline_blocks()``) another
way than its own forward: a pipeline's, or a partition across devices."""

from __future__ import annotations

from typing import Any

from lightning_hybrid.pipeline.module_contract import pipeline_blocks


class RoutedEvaluation:
    """Mixin for a strategy whose validation, test and predict steps run the module's block
    sequence (``pipeline_blocks()``) another way: while a step runs, the sequence's ``forward`` is
    the function the subclass's ``routed_forward(blocks_seq)`` returns, so the module's own step
    logic (loss, metrics, argmax) stays.
    Put it before the strategy base class."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not callable(getattr(cls, "routed_forward", None)):
            raise TypeError(
                f"{cls.__name__} uses RoutedEvaluation: define routed_forward(self, blocks_seq), returning the "
                "function that replaces blocks_seq.forward during validation, test and predict"
            )

    def _through_routed_blocks(self, hook: str, *args: Any, **kwargs: Any) -> Any:
        blocks_seq = pipeline_blocks(self.lightning_module)
        blocks_seq.forward = self.routed_forward(blocks_seq)  # instance attribute: nn.Module calls it
        try:
            return getattr(super(), hook)(*args, **kwargs)
        finally:
            del blocks_seq.forward

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._through_routed_blocks("validation_step", *args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._through_routed_blocks("test_step", *args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._through_routed_blocks("predict_step", *args, **kwargs)
