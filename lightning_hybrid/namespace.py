"""Both Lightning namespaces: the suite's Lightning glue served against ``pytorch_lightning`` and
against ``lightning`` (``import lightning as L``).

Lightning ships one Trainer as two packages with their own classes: ``pytorch_lightning`` (with
``lightning_fabric``) and ``lightning`` (``lightning.pytorch``, ``lightning.fabric``). A Trainer takes
only the strategies, callbacks and modules of its own package. The suite's source is written against
``pytorch_lightning``; this module serves it against ``lightning`` as Lightning builds its unified
package: the same source with the package names replaced, loaded by an import hook.

- ``lightning_hybrid.lightning`` and each ``lightning_hybrid.lightning.X`` are ``lightning_hybrid``
  and ``lightning_hybrid.X`` for ``lightning.pytorch``. Modules that import no Lightning (the
  algorithms, through no glue either) are shared: the same module object under both names, so their
  objects are accepted by both flavours.
- Without ``pytorch_lightning`` installed, ``lightning_hybrid`` itself is served against ``lightning``
  (and ``lightning_hybrid.lightning`` is the same modules).
- The strategies' aliases (``"ssp"``, ...) are registered with each installed namespace's
  ``StrategyRegistry`` (:func:`when_imported`): ``L.Trainer(strategy="ssp")`` gets the ``lightning``
  flavour, ``pl.Trainer(strategy="ssp")`` the ``pytorch_lightning`` one.

Plain Python: no Lightning import here (the hook imports what it serves only when asked).
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

PACKAGE = "lightning_hybrid"
PACKAGE_DIR = Path(__file__).resolve().parent
#: The ``lightning`` flavour of the package.
MIRROR = f"{PACKAGE}.lightning"
#: ``pytorch_lightning`` names and their ``lightning`` counterparts.
RENAMES = {"pytorch_lightning": "lightning.pytorch", "lightning_fabric": "lightning.fabric"}
_RENAME = re.compile(r"\b(pytorch_lightning|lightning_fabric)\b")
_OWN_NAME = re.compile(rf"\b{PACKAGE}((?:\.\w+)*)")


def installed(package: str) -> bool:
    """Whether ``package`` can be imported here (without importing it)."""
    try:
        return package in sys.modules or importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a finder that refuses it: not importable
        return False


#: The namespace ``lightning_hybrid`` itself is served against.
BASE = "pytorch_lightning" if installed("pytorch_lightning") else "lightning"


def translate(name: str) -> str:
    """A dotted ``pytorch_lightning``/``lightning_fabric`` name in the namespace ``lightning_hybrid``
    is served against (``pytorch_lightning.Trainer`` -> ``lightning.pytorch.Trainer`` where only
    ``lightning`` is installed); other names unchanged."""
    return name if BASE == "pytorch_lightning" else _RENAME.sub(lambda m: RENAMES[m.group(1)], name)


# ---------------------------------------------------------------------- which modules are glue
def _source_of(module: str) -> Path | None:
    """The file of ``lightning_hybrid[.X]`` (its ``__init__.py`` for a package), or None."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    relative = Path(*parts[1:])
    if (package := PACKAGE_DIR / relative / "__init__.py").is_file():
        return package
    if len(parts) > 1 and (file := (PACKAGE_DIR / relative).with_suffix(".py")).is_file():
        return file
    return None


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR).with_suffix("").parts
    return ".".join((PACKAGE, *(parts[:-1] if parts[-1] == "__init__" else parts)))


def _imports(path: Path) -> tuple[bool, set[str]]:
    """Whether ``path`` imports Lightning, and the package's modules it imports (anywhere in it)."""
    lightning, own = False, set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        lightning |= any(name.split(".")[0] in (*RENAMES, "lightning") for name in names)
        own |= {name for name in names if name.split(".")[0] == PACKAGE and _source_of(name) is not None}
    return lightning, own


@cache
def glue_modules() -> frozenset[str]:
    """The package's modules that import Lightning, directly or through another module of the package
    (a module's parent packages included: importing it runs them)."""
    direct, edges = set(), {}
    for path in PACKAGE_DIR.rglob("*.py"):
        name = _module_name(path)
        lightning, own = _imports(path)
        parents = {".".join(name.split(".")[:i]) for i in range(2, name.count(".") + 1)}
        edges[name] = own | parents
        if lightning:
            direct.add(name)
    glue, changed = set(direct), True
    while changed:
        grown = {name for name, deps in edges.items() if deps & glue} | glue
        changed, glue = grown != glue, grown
    return frozenset(glue)


def lightning_source(source: str, mirrored: bool) -> str:
    """``source`` against ``lightning``: Lightning's names replaced and, for the mirror, the package's
    glue modules named under :data:`MIRROR` (same lines, so tracebacks point at the file)."""
    source = _RENAME.sub(lambda m: RENAMES[m.group(1)], source)
    if not mirrored:
        return source
    glue = glue_modules()

    def rename(match: re.Match[str]) -> str:
        parts = match.group(1).split(".")[1:]
        for end in range(len(parts), 0, -1):  # the longest module prefix decides
            module = ".".join((PACKAGE, *parts[:end]))
            if _source_of(module) is not None:
                return MIRROR + match.group(1) if module in glue else match.group(0)
        return match.group(0)

    source = _OWN_NAME.sub(rename, source)
    return re.sub(rf"^(\s*from\s+){PACKAGE}(\s+import\b)", rf"\g<1>{MIRROR}\g<2>", source, flags=re.M)


# ---------------------------------------------------------------------- the import hook
class _Rewritten(importlib.abc.InspectLoader):
    """Executes a glue module's file with its source against ``lightning`` (also for ``python -m``)."""

    def __init__(self, path: Path, mirrored: bool) -> None:
        self.path, self.mirrored = path, mirrored

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def get_source(self, fullname: str) -> str:
        return lightning_source(self.path.read_text(), self.mirrored)

    def get_code(self, fullname: str) -> Any:
        return compile(self.get_source(fullname), str(self.path), "exec")

    def is_package(self, fullname: str) -> bool:
        return self.path.name == "__init__.py"

    def exec_module(self, module: ModuleType) -> None:
        exec(self.get_code(module.__name__), module.__dict__)


class _Shared(importlib.abc.Loader):
    """A mirror name of a module that imports no Lightning: the module itself."""

    def __init__(self, name: str) -> None:
        self.name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.name)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: :meth:`create_module` returned the module already imported under its own name."""


class _ThenCall(importlib.abc.Loader):
    """Another finder's loader, then the callbacks :func:`when_imported` registered."""

    def __init__(self, loader: importlib.abc.Loader, callbacks: list[Callable[[ModuleType], None]]) -> None:
        self.loader, self.callbacks = loader, callbacks

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        for callback in self.callbacks:
            callback(module)


_after_import: dict[str, list[Callable[[ModuleType], None]]] = {}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == MIRROR or fullname.startswith(MIRROR + "."):
            return self._mirror_spec(fullname)
        if BASE == "lightning" and fullname in glue_modules():
            return self._spec(fullname, fullname, mirrored=False)
        if fullname in _after_import:
            for finder in sys.meta_path:
                if finder is not self and (spec := finder.find_spec(fullname, path, target)) is not None:
                    if spec.loader is not None:
                        spec.loader = _ThenCall(spec.loader, _after_import.pop(fullname))
                    return spec
        return None

    def _mirror_spec(self, fullname: str) -> importlib.machinery.ModuleSpec | None:
        base = PACKAGE + fullname[len(MIRROR):]
        if _source_of(base) is None:
            return None
        if BASE == "lightning" or base not in glue_modules():
            return importlib.machinery.ModuleSpec(fullname, _Shared(base))
        return self._spec(fullname, base, mirrored=True)

    @staticmethod
    def _spec(fullname: str, base: str, mirrored: bool) -> importlib.machinery.ModuleSpec:
        path = _source_of(base)
        assert path is not None
        spec = importlib.util.spec_from_file_location(fullname, path, loader=_Rewritten(path, mirrored),
                                                      submodule_search_locations=[str(path.parent)]
                                                      if path.name == "__init__.py" else None)
        assert spec is not None
        return spec


def install() -> None:
    """Put the hook first on ``sys.meta_path`` (once; ``import lightning_hybrid`` does it)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def when_imported(module: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` now if ``module`` is imported, else right after its import."""
    if module in sys.modules:
        callback(sys.modules[module])
    else:
        install()
        _after_import.setdefault(module, []).append(callback)


def mirrored(obj: Any) -> Any:
    """The ``lightning`` flavour of a class or function of the package's glue (imports it)."""
    module = importlib.import_module(MIRROR + obj.__module__[len(PACKAGE):])
    return getattr(module, obj.__qualname__)
