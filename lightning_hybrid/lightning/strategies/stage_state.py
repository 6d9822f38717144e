# Generated from lightning_hybrid/strategies/stage_state.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""Strategy glue for ranks that hold only their pipeline stage: Lightning's hooks for the model created
on the meta device (``configure_model()``), each rank's tensors moved, checkpointed and restored.

:class:`StageOnlyState` is a mixin for :class:`~lightning_hybrid.HybridParallelStrategy` (put it
before the strategy base class), thin over the plain helpers: adopting a stage is
:mod:`lightning_hybrid.pipeline.stage_adoption` (on :mod:`~lightning_hybrid.pipeline.materialize`), checkpointing
one :mod:`lightning_hybrid.pipeline.stage_checkpoint`.
"""

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
from lightning_hybrid.strategies.replaced_step import unwrap_optimizer


class StageOnlyState:
    """Each rank's own stage as the model's state; the whole model on rank 0 for checkpoints.

    A mixin of a pipeline strategy, which provides what it declares below (and Lightning's
    ``lightning_module``, ``global_rank``, ``root_device``)."""

    #: The placement in use (None before it is planned).
    placement: Any
    #: The ranks as a mesh of pipeline stages and data-parallel replicas (:class:`~lightning_hybrid.pipeline.mesh.Mesh`).
    mesh: Any
    #: This rank's pipeline's process group (the stages that exchange activations).
    _pp_group: Any

    @contextmanager
    def tensor_init_context(self, empty_init: bool | None = None) -> Generator[None, None, None]:
        """``configure_model()`` (and ``trainer.init_module()``) create the model on the meta device;
        each rank materialises its own stage at setup, each module from the random state noted at its
        creation here (:class:`~lightning_hybrid.pipeline.materialize.RecordRandomState`), then by the
        model's ``init_weights(block)`` where it has one; initialisation done in ``__init__`` outside
        ``reset_parameters()`` without that hook is warned about, naming the tensors."""
        with RecordRandomState() as recorded, NoteInitialisation() as noted, torch.device("meta"):
            yield
        self._init_states, self._init_noted = recorded.states, noted

    def _stage_blocks(self, blocks: list[torch.nn.Module], names: list[str], own: range) -> None:
        """This rank's blocks of a model whose stages are ``placement``'s (:func:`adopt_stage`): a model
        built on the meta device materialised on the CPU (its ``init_weights`` hook, if any, replayed;
        model_to_device moves it on), one built whole rid of the other stages and their optimizer state."""
        hook = None
        if any(is_freed(block) for block in blocks):
            container = pipeline_blocks(self.lightning_module)
            hook = init_weights_hook(container, self.lightning_module)
            if getattr(self, "_init_noted", None) is not None and self.global_rank == 0:
                self._init_noted.warn_unreplayed(container, hooked=callable(hook))
        adopt_stage(blocks, names, [range(stage.start, stage.stop) for stage in self.placement.stages], own,
                    [unwrap_optimizer(optimizer) for optimizer in self.optimizers],
                    getattr(self, "_init_states", None), init_weights=hook)

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        """Checkpoints load once each rank holds its stage (their tensors, not the meta ones)."""
        return True

    def model_to_device(self) -> None:
        """The stage's tensors to this rank's device; the other stages' stay on the meta device."""
        assert self.model is not None
        self.model._apply(lambda t: t if t.is_meta else t.to(self.root_device))
        _update_properties(self.model, device=self.root_device)  # what module.to() records: self.device

    def _holders(self) -> dict[int, int]:
        """``id(tensor)`` -> the rank of this replica that holds it (valid from setup on)."""
        blocks = [block for _, block in pipeline_blocks(self.lightning_module).named_children()]
        replica = self.mesh.replica_of(self.global_rank)
        return block_holders(blocks, [range(st.start, st.stop) for st in self.placement.stages],
                             lambda stage: self.mesh.stage_rank(replica, stage))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state dict on rank 0 (every rank calls it; the others get ``{}``), each
        tensor sent once by its holder in rank 0's pipeline (:func:`gather_state_dict`)."""
        module = self.lightning_module
        if self.placement is None:  # not placed yet: every rank holds the whole model
            return {name: t.detach().cpu() for name, t in module.state_dict().items()}
        if self.mesh.replica_of(self.global_rank) != 0:  # rank 0's pipeline gathers; the other replicas hold the same
            return {}
        return gather_state_dict(module, self._holders(), self.global_rank, 0, self._pp_group, self.root_device)

    def lightning_module_state_dict(self) -> dict[str, Any]:
        return self.full_state_dict()

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        """The optimizer's state for every stage's parameters on rank 0 (:func:`gather_optimizer_state`);
        the other ranks get their own stage's."""
        state = super().optimizer_state(optimizer)
        if self.placement is None or self.mesh.replica_of(self.global_rank) != 0:
            return state
        params = [p for group in unwrap_optimizer(optimizer).param_groups for p in group["params"]]
        return gather_optimizer_state(state, params, self._holders(), self.global_rank, 0, self._pp_group)

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        """Load this rank's tensors from a full checkpoint (the other stages' stay freed)."""
        module = self.lightning_module
        current = module.state_dict(keep_vars=True)
        missing, unexpected = module.load_state_dict(own_part(checkpoint["state_dict"], current), strict=False)
        missing = [k for k in missing if not current[k].is_meta]
        if strict and (missing or unexpected):
            raise RuntimeError(f"checkpoint does not match {type(module).__name__}: missing {missing[:5]}, unexpected {unexpected[:5]}")

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Each rank restores the optimizer state of its own stage's parameters."""
        states = []
        for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"]):
            params = [p for group in unwrap_optimizer(optimizer).param_groups for p in group["params"]]
            states.append({**state, "state": {i: v for i, v in state["state"].items() if not params[int(i)].is_meta}})
        super().load_optimizer_state_dict({**checkpoint, "optimizer_states": states})

    def teardown(self) -> None:
        module = self.lightning_module
        if module is None or not is_freed(module):
            return super().teardown()
        module._apply(lambda t: t if t.is_meta else t.cpu())  # Lightning's .cpu() cannot move meta tensors
        module.cpu = lambda: module
        try:
            super().teardown()
        finally:
            del module.cpu

