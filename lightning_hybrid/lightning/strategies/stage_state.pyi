# Generated from lightning_hybrid/strategies/stage_state.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from typing import Any
import torch
from lightning.fabric.utilities.device_dtype_mixin import _update_properties
from lightning_hybrid.pipeline import pipeline_blocks
from lightning_hybrid.pipeline.materialize import NoteInitialisation, RecordRandomState, init_weights_hook, is_freed
from lightning_hybrid.pipeline.stage_adoption import adopt_stage
from lightning_hybrid.pipeline.stage_checkpoint import block_holders, gather_optimizer_state, gather_state_dict, own_part
from lightning_hybrid.lightning.strategies import common

class StageOnlyState:
    placement: Any
    mesh: Any
    _pp_group: Any

    @contextmanager
    def tensor_init_context(self, empty_init: bool | None=None) -> Generator[None, None, None]:
        ...

    def _stage_blocks(self, blocks: list[torch.nn.Module], names: list[str], own: range) -> None:
        ...

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        ...

    def model_to_device(self) -> None:
        ...

    def _holders(self) -> dict[int, int]:
        ...

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        ...

    def lightning_module_state_dict(self) -> dict[str, Any]:
        ...

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        ...

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool=True) -> None:
        ...

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        ...

    def teardown(self) -> None:
        ...
