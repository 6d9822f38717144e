"""A pipeline stage that holds only its own blocks: freeing the others, materialising a model built
on the meta device, and meta copies for planning.

* :func:`free` turns a block's parameters and buffers into meta tensors (no memory), keeping each
  tensor object, so an optimizer built over the whole model still holds them (with no gradient,
  it skips them).
* :class:`RecordRandomState` notes the CPU random state when each module registers its first
  parameter (as a model is created on the meta device, where nothing is drawn), and
  :func:`materialize` gives such a model real tensors for the blocks of one stage: every module up to
  the stage's last is initialised by its ``reset_parameters()`` on the CPU, in block order and within
  a block in registration order, continuing one random stream and jumping to a noted state only where
  it changed between two modules' creation (the model's own ``torch.manual_seed`` calls; nothing else
  changes it on the meta device). Where that order is the order the modules were created (an
  ``nn.Sequential`` built front to back), the values are those one process draws building the whole
  model; the other stages' blocks are freed right after their draws (at most one of them held at a
  time).
* :func:`meta_copy` is a block with the same structure on the meta device (for FLOPs and
  activation sizes without memory).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_parameter_registration_hook
from torch.utils import swap_tensors


def _own_tensors(module: nn.Module) -> Iterable[torch.Tensor]:
    yield from module.parameters(recurse=False)
    yield from module.buffers(recurse=False)


def tensor_bytes(modules: Iterable[nn.Module], freed: bool = False) -> int:
    """Bytes of the parameters and buffers of ``modules`` that hold memory (``freed``: of those that don't)."""
    seen: set[int] = set()
    total = 0
    for module in modules:
        for tensor in [*module.parameters(), *module.buffers()]:
            if id(tensor) not in seen and tensor.is_meta == freed:
                seen.add(id(tensor))
                total += tensor.numel() * tensor.element_size()
    return total


def is_freed(module: nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` is on the meta device."""
    return any(t.is_meta for t in [*module.parameters(), *module.buffers()])


def free(module: nn.Module) -> None:
    """Replace every parameter and buffer of ``module`` by a meta tensor in place (same objects)."""
    for sub in module.modules():
        for tensor in list(sub._parameters.values()):
            if tensor is not None and not tensor.is_meta:
                tensor.grad = None
                swap_tensors(tensor, nn.Parameter(torch.empty_like(tensor, device="meta"), tensor.requires_grad))
        for name, tensor in list(sub._buffers.items()):
            if tensor is not None and not tensor.is_meta:
                sub._buffers[name] = torch.empty_like(tensor, device="meta")


class RecordRandomState:
    """Context manager: ``states[module]`` is the CPU random state when ``module`` registered its first
    parameter inside the context (a layer's ``reset_parameters()`` runs right after, in ``__init__``)."""

    def __init__(self) -> None:
        self.states: dict[nn.Module, torch.Tensor] = {}
        self._handle: Any = None

    def _note(self, module: nn.Module, name: str, param: Any) -> None:
        if module not in self.states:
            self.states[module] = torch.random.get_rng_state()

    def __enter__(self) -> RecordRandomState:
        self._handle = register_module_parameter_registration_hook(self._note)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handle.remove()


class _Stream:
    """Replays a meta build's random stream: continue it, or jump where the build's own state changed."""

    def __init__(self, states: dict[nn.Module, torch.Tensor] | None) -> None:
        self.states, self.last = states or {}, None

    def before(self, module: nn.Module) -> None:
        noted = self.states.get(module)
        if noted is not None and (self.last is None or not torch.equal(noted, self.last)):
            torch.random.set_rng_state(noted)
        if noted is not None:
            self.last = noted


def _initialise(block: nn.Module, device: torch.device | str, stream: _Stream) -> None:
    """Real, uninitialised tensors for ``block`` on ``device``, then each module's ``reset_parameters()``."""
    block.to_empty(device=device)
    for name, sub in block.named_modules():
        if not any(True for _ in _own_tensors(sub)):
            continue
        reset = getattr(sub, "reset_parameters", None)
        if not callable(reset):
            raise TypeError(
                f"{type(sub).__name__} ({name or 'the block'}) has parameters or buffers but no reset_parameters(): "
                "a model created on the meta device (configure_model) is initialised by each module's "
                "reset_parameters(), as in FSDP. Define it (put the module's initialisation there), or build the "
                "model in __init__"
            )
        stream.before(sub)
        reset()


def materialize(blocks: Sequence[nn.Module], keep: range, device: torch.device | str,
                states: dict[nn.Module, torch.Tensor] | None = None) -> None:
    """Materialise blocks ``keep`` of a model created on the meta device, on ``device``.

    Every block up to the last kept one is initialised in order on the CPU, from the current random
    state or the ``states`` :class:`RecordRandomState` noted (see the module's docstring); those
    outside ``keep`` are freed right after, ``keep`` is moved to ``device``. Materialise from an
    all-meta model (blocks already real are skipped, and their draws not replayed). The random state
    is restored afterwards."""
    saved = torch.random.get_rng_state()
    stream = _Stream(states)
    try:
        for index, block in enumerate(blocks):
            if index >= keep.stop:
                break
            if not is_freed(block):
                continue
            _initialise(block, "cpu", stream)
            if index in keep:
                block.to(device)
            else:
                free(block)
    finally:
        torch.random.set_rng_state(saved)


def meta_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters and buffers are meta tensors (nothing is copied)."""
    memo: dict[int, torch.Tensor] = {}
    for tensor in module.parameters():
        memo[id(tensor)] = nn.Parameter(torch.empty_like(tensor, device="meta"), tensor.requires_grad)
    for tensor in module.buffers():
        memo[id(tensor)] = torch.empty_like(tensor, device="meta")
    return copy.deepcopy(module, memo)
