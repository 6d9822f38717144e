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
  A model whose ``__init__`` initialises further after building its layers (Kaiming, a zero scale)
  gives that step as an ``init_weights(block)`` method: called for each block in order after every
  block's ``reset_parameters()``, as ``__init__`` runs it after building them all, it makes the stage's
  values those of ``__init__`` (:class:`NoteInitialisation` warns, naming the tensors, where a model
  initialises in ``__init__`` without one).
* Parameters tied across blocks (one tensor in two places): :func:`tied_parameters` finds them,
  :func:`check_ties` refuses ties that cross stages (each stage would train its own copy), and
  :func:`materialize` keeps the ties inside a stage (``to_empty`` would untie them).
* :func:`meta_copy` is a block with the same structure on the meta device (for FLOPs and
  activation sizes without memory).
"""

from __future__ import annotations

import copy
import inspect
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
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


#: Functions whose frames make an initialisation a layer's own (replayed at materialisation).
_INITIALISERS = ("reset_parameters", "_reset_parameters", "init_weights")
_INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
                   "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")


class NoteInitialisation:
    """Context manager: notes the tensors that ``torch.nn.init`` functions fill outside any
    ``reset_parameters()`` / ``init_weights()`` (a model's own initialisation in ``__init__``), which a
    model created on the meta device and materialised by ``reset_parameters()`` would not get.
    :meth:`warn_unreplayed` names them."""

    def __init__(self) -> None:
        self.noted: dict[int, str] = {}  # id(tensor) -> the init function
        self._saved: dict[str, Callable] = {}

    def __enter__(self) -> NoteInitialisation:
        init = torch.nn.init
        for name in _INIT_FUNCTIONS:
            original = self._saved[name] = getattr(init, name)

            def noting(tensor: torch.Tensor, *args: Any, _original: Callable = original, _name: str = name,
                       **kwargs: Any) -> Any:
                frame = sys._getframe(1)
                while frame is not None and frame.f_code.co_name not in _INITIALISERS:
                    frame = frame.f_back
                if frame is None:
                    self.noted[id(tensor)] = _name
                return _original(tensor, *args, **kwargs)

            setattr(init, name, noting)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, original in self._saved.items():
            setattr(torch.nn.init, name, original)

    def warn_unreplayed(self, module: nn.Module, hooked: bool) -> list[str]:
        """Warn (naming them) about ``module``'s tensors initialised outside ``reset_parameters()``
        unless the model has an ``init_weights`` hook (``hooked``); returns their names."""
        names = [f"{name} ({self.noted[id(t)]})" for name, t in [*module.named_parameters(), *module.named_buffers()]
                 if id(t) in self.noted]
        if names and not hooked:
            warnings.warn(
                f"{type(module).__name__} initialises {', '.join(names[:5])}{' ...' if len(names) > 5 else ''} in "
                "__init__, outside reset_parameters(): built on the meta device (configure_model()), each stage "
                "gets reset_parameters()'s values instead. Give the model an init_weights(block) method doing that "
                "initialisation for one of its blocks (ResAttNet3D's is an example); it is called after "
                "materialising them", stacklevel=2)
        return names


def init_weights_hook(*owners: Any) -> Callable[[nn.Module], None] | None:
    """The first owner's ``init_weights(block)`` method (None: none has one); a method of that name that
    takes no ``block`` (torchtitan's ``init_weights(buffer_device)``, a whole-model one) is refused."""
    for owner in owners:
        hook = getattr(owner, "init_weights", None)
        if callable(hook):
            if "block" not in inspect.signature(hook).parameters:
                raise TypeError(
                    f"a pipeline stage built on the meta device calls init_weights(block) for each of its blocks after "
                    f"materialising them; {type(owner).__name__}.init_weights{inspect.signature(hook)} takes no `block`: "
                    "give it that parameter (initialise that block only), or rename the method")
            return hook
    return None


def tied_parameters(blocks: Sequence[nn.Module]) -> list[list[tuple[int, str]]]:
    """Each parameter held in several places of ``blocks``: its places, as (block index, name in the block)."""
    places: dict[int, list[tuple[int, str]]] = {}
    for index, block in enumerate(blocks):
        for name, param in block.named_parameters(remove_duplicate=False):
            places.setdefault(id(param), []).append((index, name))
    return [where for where in places.values() if len(where) > 1]


def check_ties(blocks: Sequence[nn.Module], stages: Sequence[range], names: Sequence[str]) -> None:
    """Refuse parameters tied across stages (``stages``: the blocks of each), naming them."""
    stage_of = {index: number for number, stage in enumerate(stages) for index in stage}
    for where in tied_parameters(blocks):
        if len({stage_of.get(index) for index, _ in where}) > 1:
            places = [f"{names[index]}.{name} (stage {stage_of.get(index)})" for index, name in where]
            raise ValueError(
                f"{' and '.join(places)} are one tensor (tied weights) in different pipeline stages: each stage "
                "would train its own copy. Place the blocks holding it in one stage (placement=[...]), or untie them")


def _retie(blocks: Sequence[nn.Module], ties: list[list[tuple[int, str]]], keep: range) -> None:
    """Give every place of a tie inside ``keep`` the parameter of its first place."""
    for where in ties:
        inside = [(index, name) for index, name in where if index in keep]
        if len(inside) < 2:
            continue
        first = blocks[inside[0][0]].get_parameter(inside[0][1])
        for index, name in inside[1:]:
            owner, _, attribute = name.rpartition(".")
            setattr(blocks[index].get_submodule(owner) if owner else blocks[index], attribute, first)


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
                states: dict[nn.Module, torch.Tensor] | None = None,
                init_weights: Callable[[nn.Module], None] | None = None) -> None:
    """Materialise blocks ``keep`` of a model created on the meta device, on ``device``.

    Every block up to the last kept one is initialised in order on the CPU, from the current random
    state or the ``states`` :class:`RecordRandomState` noted (see the module's docstring); those
    outside ``keep`` are freed right after, ``keep`` is moved to ``device``. With ``init_weights`` (the
    model's ``init_weights(block)``) every block is reset first (the later ones too: ``__init__`` drew
    all of them before its own initialisation), then ``init_weights`` runs on each block up to the last
    kept one, in order (the others' on a scratch copy, for the random stream). Parameters tied within
    ``keep`` stay tied (check ties across stages with :func:`check_ties`). Materialise from an
    all-meta model (blocks already real are skipped, and their draws not replayed). The random state
    is restored afterwards."""
    saved = torch.random.get_rng_state()
    stream = _Stream(states)
    ties = tied_parameters(blocks)
    last = len(blocks) if init_weights is not None else keep.stop
    try:
        real = [not is_freed(block) for block in blocks]
        for index, block in enumerate(blocks[:last]):
            if real[index]:
                continue
            _initialise(block, "cpu", stream)
            if index not in keep:
                free(block)
        if init_weights is not None:
            for index, block in enumerate(blocks[: keep.stop]):
                if real[index]:
                    continue
                if index in keep:
                    init_weights(block)
                else:  # its draws, into a scratch copy: the random stream as __init__ consumed it
                    block.to_empty(device="cpu")
                    init_weights(block)
                    free(block)
        _retie(blocks, ties, keep)
        for index in keep:
            blocks[index].to(device)
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
