# Generated from lightning_hybrid/strategies/stage_state.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""Strategy glue for ranks that hold only their pipeline stage: the model created on the meta
device (``configure_model()``), each rank's tensors moved, checkpointed and restored, and the whole
model gathered stage by stage for checkpoints.

:class:`StageOnlyState` is a mixin for :class:`~lightning_hybrid.HybridParallelStrategy` (put it
before the strategy base class); the plain helpers are :mod:`lightning_hybrid.pipeline.materialize`.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from lightning.fabric.utilities.device_dtype_mixin import _update_properties

from lightning_hybrid.comm.collectives import exchange, receive_object, send_object
from lightning_hybrid.pipeline import pipeline_blocks
from lightning_hybrid.pipeline.materialize import (
    NoteInitialisation, RecordRandomState, check_ties, init_weights_hook, is_freed, materialize,
)
from lightning_hybrid.lightning.strategies import common


class StageOnlyState:
    """Each rank's own stage as the model's state; the whole model on rank 0 for checkpoints.

    Needs ``placement`` (the :class:`~lightning_hybrid.placement.Placement` in use, else None),
    ``mesh`` and ``_pp_group`` from the strategy."""

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
        """This rank's blocks of a model whose stages are ``placement``'s: ties across stages refused;
        a model built on the meta device materialised (its ``init_weights`` hook, if any, replayed)."""
        check_ties(blocks, [range(stage.start, stage.stop) for stage in self.placement.stages], names)
        if any(is_freed(block) for block in blocks):
            container = pipeline_blocks(self.lightning_module)
            hook = init_weights_hook(container, self.lightning_module)
            if getattr(self, "_init_noted", None) is not None and self.global_rank == 0:
                self._init_noted.warn_unreplayed(container, hooked=callable(hook))
            materialize(blocks, own, "cpu", self._init_states, init_weights=hook)  # model_to_device moves it on

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
        """``id(tensor)`` -> the rank of this replica that holds it, for every block tensor (from the
        placement: valid from setup on, before the first batch builds the pipeline)."""
        blocks = [block for _, block in pipeline_blocks(self.lightning_module).named_children()]
        replica = self.mesh.replica_of(self.global_rank)
        holders: dict[int, int] = {}
        for index, stage in enumerate(self.placement.stages):
            rank = self.mesh.stage_rank(replica, index)
            for block in blocks[stage.start:stage.stop]:
                holders.update((id(t), rank) for t in [*block.parameters(), *block.buffers()])
        return holders

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state dict on rank 0, in its CPU memory, sent tensor by tensor to it by the
        ranks of its pipeline that hold each stage (every rank calls it; the others get ``{}``). Each
        tensor travels once, from its holder to rank 0; never more than one tensor of another stage on
        rank 0's device."""
        module = self.lightning_module
        if self.placement is None:  # not placed yet: every rank holds the whole model
            return {name: t.detach().cpu() for name, t in module.state_dict().items()}
        if self.mesh.replica_of(self.global_rank) != 0:  # rank 0's pipeline gathers; the other replicas hold the same
            return {}
        holders = self._holders()
        full: dict[str, torch.Tensor] = {}
        for name, tensor in module.state_dict(keep_vars=True).items():
            src = holders.get(id(tensor), 0)
            tensor = tensor.detach()
            if src != 0 and self.global_rank == src:
                exchange([(tensor.contiguous(), 0)], [], group=self._pp_group)
            elif src != 0 and self.global_rank == 0:
                received = torch.empty(tensor.shape, dtype=tensor.dtype, device=self.root_device)
                exchange([], [(received, src)], group=self._pp_group)
                full[name] = received.cpu()
            elif self.global_rank == 0:
                full[name] = tensor.cpu().clone()
        return full

    def lightning_module_state_dict(self) -> dict[str, Any]:
        return self.full_state_dict()

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        """The optimizer's state for every stage's parameters on rank 0, parameter by parameter from the
        rank that holds it, sent to rank 0 alone (the other ranks get their own stage's)."""
        state = super().optimizer_state(optimizer)
        if self.placement is None or self.mesh.replica_of(self.global_rank) != 0:
            return state
        holders = self._holders()
        params = [p for group in common.unwrap_optimizer(optimizer).param_groups for p in group["params"]]
        merged = {}
        for index, param in enumerate(params):
            src = holders.get(id(param), 0)
            value = state["state"].get(index)
            if src != 0 and self.global_rank == src:
                send_object(_to_cpu(value), dst=0, group=self._pp_group)
            elif src != 0 and self.global_rank == 0:
                value = receive_object(src=src, group=self._pp_group)
            if value is not None:
                merged[index] = value
        if self.global_rank == 0:
            state["state"] = merged
        return state

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        """Load this rank's tensors from a full checkpoint (the other stages' stay freed)."""
        module = self.lightning_module
        current = module.state_dict(keep_vars=True)
        state = checkpoint["state_dict"]
        missing, unexpected = module.load_state_dict(
            {k: v for k, v in state.items() if not (k in current and current[k].is_meta)}, strict=False)
        missing = [k for k in missing if not current[k].is_meta]
        if strict and (missing or unexpected):
            raise RuntimeError(f"checkpoint does not match {type(module).__name__}: missing {missing[:5]}, unexpected {unexpected[:5]}")

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Each rank restores the optimizer state of its own stage's parameters."""
        states = []
        for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"]):
            params = [p for group in common.unwrap_optimizer(optimizer).param_groups for p in group["params"]]
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


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value
