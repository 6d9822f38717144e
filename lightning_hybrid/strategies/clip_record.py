"""Strategy glue: how Lightning clipped a step's gradients (``gradient_clip_val`` and its algorithm, or a
module's ``configure_gradient_clipping`` calling ``clip_gradients``), recorded as a
:class:`~lightning_hybrid.comm.clipping.Clip`, so that an average that arrives later is clipped the same
way: DDP clips the averaged gradient."""

from __future__ import annotations

from typing import Any

from lightning_hybrid.comm.clipping import Clip

_RECORD = "_lightning_hybrid_clip_record"


class ClipRecord:
    """Records every ``clip_gradients`` call of a precision plugin (the last one of a step counts).
    ``clips=False``: records without clipping (for a strategy that clips the average itself, elsewhere)."""

    def __init__(self, precision_plugin: Any, clips: bool = True) -> None:
        self._clip: Clip | None = None
        self.clips = clips
        if getattr(precision_plugin, _RECORD, None) is None:
            original = precision_plugin.clip_gradients

            def clip_gradients(optimizer: Any, clip_val: float | int = 0.0, gradient_clip_algorithm: Any = "norm") -> None:
                record = getattr(precision_plugin, _RECORD)
                if record is not None and clip_val and clip_val > 0:
                    record._clip = Clip(float(clip_val), "value" if str(gradient_clip_algorithm).lower().endswith("value") else "norm")
                    if not record.clips:
                        return None
                return original(optimizer, clip_val, gradient_clip_algorithm)

            precision_plugin.clip_gradients = clip_gradients
        setattr(precision_plugin, _RECORD, self)

    def take(self) -> Clip | None:
        """How this step's gradient was clipped (None: not at all); the record starts afresh."""
        clip, self._clip = self._clip, None
        return clip
