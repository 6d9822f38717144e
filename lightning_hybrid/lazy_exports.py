"""Package exports imported on first use (PEP 562), for the packages whose exports are Lightning glue
(``data``, ``cli``, ``strategies``, ``callbacks``): importing a plain module under such a package then
imports no Lightning, so it is one module under both Lightning namespaces (:mod:`lightning_hybrid.namespace`,
which reads each package's ``LAZY`` table).

Example::

    >>> table = {"sqrt": "math"}
    >>> __getattr__, __dir__ = lazy_exports({}, table)
    >>> __getattr__("sqrt")(9.0)
    3.0
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(package: dict[str, Any], table: Mapping[str, str], module_of: Callable[[str], str] = str,
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` (pass its ``globals()``): each name of ``table`` imported
    from its module (``module_of(module)``) on first use and kept in the package."""

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package['__name__']!r} has no attribute {name!r}")
        value = getattr(import_module(module_of(table[name])), name)
        package[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*package, *table})

    return __getattr__, __dir__
