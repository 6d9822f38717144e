"""Names that moved or were renamed, kept working for a release: using one warns (a ``FutureWarning``,
shown by default) naming the new one, and gives the new object.

Example::

    >>> import warnings
    >>> __getattr__ = renamed({"__name__": "old"}, {"root": "math:sqrt"})
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     value = __getattr__("root")(9.0)
    >>> value, str(caught[0].message)
    (3.0, 'old.root is now math.sqrt; the old name goes in the next release')
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn that ``old`` (a name a user types: a class, a module, a config group's option) is now ``new``."""
    warnings.warn(f"{old} is now {new}; the old name goes in the next release", FutureWarning, stacklevel=stacklevel)


def renamed(package: dict[str, Any], table: Mapping[str, str]) -> Callable[[str], Any]:
    """A module's ``__getattr__`` (pass its ``globals()``) for its old names: ``table`` maps each to
    ``"module"`` (the same name there) or ``"module:new_name"``; using one warns and returns the new object."""

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package['__name__']!r} has no attribute {name!r}")
        module, _, new = table[name].partition(":")
        warn_renamed(f"{package['__name__']}.{name}", f"{module}.{new or name}")
        return getattr(import_module(module), new or name)

    return __getattr__
