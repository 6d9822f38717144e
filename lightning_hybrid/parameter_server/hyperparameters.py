"""The hyperparameters of an optimizer's parameter groups that travel with each push, so that whatever a
scheduler changes on the workers (the learning rate, SGD's momentum, Adam's betas, the weight decay...) is
what the server's optimizer steps with, as under DDP, where every rank steps its own optimizer.

A :class:`GroupLayout` lists, in a fixed order (group by group, keys sorted), every value of each
``optimizer.param_groups[i]`` but ``params`` that is a number (a float, an int, a bool: ``nesterov``,
``maximize``) or a tuple or list of numbers (``betas``): each push carries them flattened into one float64
tensor (:class:`GroupValues`: an SGD group is 7 values), and the server, which built the same layout from
the optimizer worker 0 handed it (``Init``), sets them on its own groups before each step. The layout's
:attr:`~GroupLayout.fingerprint` travels with the values: a worker whose optimizer's groups differ from
worker 0's is refused with an error rather than read wrongly. Any other value (``foreach=None``, a tensor
``lr``, a group's name) travels once, with the optimizer at ``Init``; a worker whose group changes one later,
or gains or loses a key, gets a ``ValueError`` naming it (:meth:`GroupLayout.values`): the server could not
follow it.

A push may also carry each group's learning rate only (a plain sequence, one per group: the protocol's
first form, still accepted); the server then keeps the rest of its groups as they are.

Example::

    >>> import torch
    >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1, momentum=0.9)
    >>> layout = GroupLayout.of(opt.param_groups)
    >>> [key for _, key in layout.keys]
    ['dampening', 'differentiable', 'lr', 'maximize', 'momentum', 'nesterov', 'weight_decay']
    >>> opt.param_groups[0]["momentum"] = 0.85  # a scheduler's
    >>> values = layout.values(opt.param_groups)
    >>> server = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1, momentum=0.9)
    >>> layout.apply(server.param_groups, values.tolist()); server.param_groups[0]["momentum"]
    0.85
"""

from __future__ import annotations

import functools
import numbers
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

#: A push's ``layout`` when it brings each group's learning rate only (the protocol's first form).
LEARNING_RATES = 0
#: A number's kind: how the server gives it back (a bool as a bool, an integral int as an int, else a float).
BOOL, INT, FLOAT = "bool", "int", "float"


def _kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, numbers.Integral):
        return INT
    if isinstance(value, numbers.Real):
        return FLOAT
    return None


def _shape(value: Any) -> tuple[str, tuple[str, ...]] | None:
    """``(container, kinds)`` of a value that travels: ``("", (kind,))`` for a number, ``("tuple", kinds)``
    or ``("list", kinds)`` for a non-empty tuple or list of numbers; None for anything else."""
    kind = _kind(value)
    if kind is not None:
        return "", (kind,)
    if isinstance(value, (tuple, list)) and value:
        kinds = tuple(_kind(v) for v in value)
        if None not in kinds:
            return type(value).__name__, kinds
    return None


def _restored(kind: str, number: float) -> bool | int | float:
    if kind == BOOL:
        return bool(number)
    if kind == INT and float(number).is_integer():
        return int(number)
    return float(number)  # an int the worker's scheduler made a float (lr=1, then 0.5) stays one


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a, b))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a value whose == is not a truth value: compare identity
        return a is b


@dataclass(frozen=True)
class Entry:
    """One travelling value: ``param_groups[group][key]``, a number (``container=""``) or a tuple or list of
    ``len(kinds)`` numbers."""

    group: int
    key: str
    container: str
    kinds: tuple[str, ...]

    def read(self, value: Any) -> list[float]:
        return [float(v) for v in (value if self.container else (value,))]

    def restore(self, numbers_: Sequence[float]) -> Any:
        restored = [_restored(kind, n) for kind, n in zip(self.kinds, numbers_)]
        if not self.container:
            return restored[0]
        return tuple(restored) if self.container == "tuple" else restored


@dataclass(frozen=True)
class GroupValues:
    """What a push carries of the worker's parameter groups: ``values`` (float64) in the order of the layout
    whose :attr:`GroupLayout.fingerprint` is ``layout``."""

    values: torch.Tensor
    layout: int


@dataclass(frozen=True)
class GroupLayout:
    """Which values of an optimizer's parameter groups travel with a push, in which order (see the module doc)."""

    entries: tuple[Entry, ...]
    groups: int
    #: The values that do not travel, as they were when the layout was made (a worker checks them at each push).
    fixed: Mapping[tuple[int, str], Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, param_groups: Sequence[Mapping[str, Any]]) -> GroupLayout:
        entries, fixed = [], {}
        for g, group in enumerate(param_groups):
            for key in sorted(k for k in group if k != "params"):
                value = group[key]
                shape = _shape(value)
                if shape is None:
                    fixed[g, key] = value.detach().clone() if isinstance(value, torch.Tensor) else value
                else:
                    entries.append(Entry(g, key, *shape))
        return cls(tuple(entries), len(param_groups), fixed)

    @property
    def size(self) -> int:
        """The float64 values a push carries."""
        return sum(len(e.kinds) for e in self.entries)

    @property
    def keys(self) -> list[tuple[int, str]]:
        """``(group, key)`` of each travelling value, in order."""
        return [(e.group, e.key) for e in self.entries]

    @functools.cached_property
    def _shapes(self) -> dict[tuple[int, str], tuple[str, int]]:
        return {(e.group, e.key): (e.container, len(e.kinds)) for e in self.entries}

    @functools.cached_property
    def _keys_of_groups(self) -> list[set[str]]:
        keys: list[set[str]] = [set() for _ in range(self.groups)]
        for g, key in [*self.keys, *self.fixed]:
            keys[g].add(key)
        return keys

    @functools.cached_property
    def fingerprint(self) -> int:
        """A number both ends compute from the layout (never 0, which stands for "learning rates only")."""
        text = f"{self.groups};" + ";".join(f"{e.group}:{e.key}:{e.container}:{len(e.kinds)}" for e in self.entries)
        return zlib.crc32(text.encode()) or LEARNING_RATES + 1

    def values(self, param_groups: Sequence[Mapping[str, Any]]) -> torch.Tensor:
        """The travelling values of ``param_groups`` now, flattened (float64); a ValueError naming the first
        value the server could not follow (see :meth:`check`)."""
        self.check(param_groups)
        flat: list[float] = []
        for e in self.entries:
            flat.extend(e.read(param_groups[e.group][e.key]))
        return torch.tensor(flat, dtype=torch.float64)

    def group_values(self, param_groups: Sequence[Mapping[str, Any]]) -> GroupValues:
        """:meth:`values` with this layout's fingerprint: what a push carries."""
        return GroupValues(self.values(param_groups), self.fingerprint)

    def check(self, param_groups: Sequence[Mapping[str, Any]]) -> None:
        """A ValueError unless ``param_groups`` still have this layout's groups and keys, each travelling value
        still a number (or as many numbers), and every other value as it was."""
        if len(param_groups) != self.groups:
            raise ValueError(f"the optimizer has {len(param_groups)} param groups; it had {self.groups} when it was "
                             "handed to the parameter server (add groups in configure_optimizers)")
        shapes, expected = self._shapes, self._keys_of_groups
        for g, group in enumerate(param_groups):
            keys = [k for k in group if k != "params"]
            if set(keys) != expected[g]:
                raise ValueError(f"param group {g} has the keys {sorted(keys)}; it had {sorted(expected[g])} when the "
                                 "optimizer was handed to the parameter server, which cannot follow a key added or "
                                 "removed later")
            for key in keys:
                value = group[key]
                if (g, key) in shapes:
                    shape = _shape(value)
                    if shape is None or (shape[0], len(shape[1])) != shapes[g, key]:
                        raise ValueError(
                            f"param group {g}'s {key!r} is now {value!r}; the parameter server receives it as a number "
                            "(or as many numbers as it had) at each step: keep it one"
                        )
                elif not _same(value, self.fixed[g, key]):
                    raise ValueError(
                        f"param group {g}'s {key!r} changed from {self.fixed[g, key]!r} to {value!r} after the optimizer "
                        "was handed to the parameter server: only numbers (and tuples of numbers) travel with each "
                        f"push; other values are the server's as they were then. Keep {key!r} as it was, or make it a "
                        "number (a float learning rate rather than a tensor)."
                    )

    def apply(self, param_groups: Sequence[dict[str, Any]], values: Sequence[float]) -> None:
        """Set the travelling values of ``param_groups`` from ``values`` (as :meth:`values` flattened them)."""
        start = 0
        for e in self.entries:
            width = len(e.kinds)
            param_groups[e.group][e.key] = e.restore(values[start : start + width])
            start += width
