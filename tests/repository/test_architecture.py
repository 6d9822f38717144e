"""The package's layout rules (ARCHITECTURE.md): one concept per module, imports in one direction.

Parts are the package's top-level modules and subpackages. Lightning glue (the strategies, the CLI,
the callbacks, the classifier, the datamodules, explain) may import the algorithms; the algorithms
(plain torch) import neither the glue nor Lightning; no two parts import each other, directly or
through others, lazy imports inside functions included.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "lightning_hybrid"
ALGORITHMS = {"balance", "comm", "deprecation", "devices", "fit_stop", "lazy_exports", "metrics", "models", "namespace",
              "parameter_server", "partition", "pipeline", "placement", "run_folder", "say", "sim", "straggler_analysis",
              "transfer"}
GLUE = {"callbacks", "classifier", "cli", "data", "explain", "lightning", "preemption", "straggler", "strategies", "watchdog"}
LIGHTNING = ("pytorch_lightning", "lightning_fabric", "lightning")
#: The most lines a hand-written module may have (issue 54).
MAX_LINES = 500
MODULES = sorted(p for p in PACKAGE.rglob("*.py"))


def part_of(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0].removesuffix(".py") if len(relative.parts) > 1 or relative.name != "__init__.py" else "__init__"


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside functions, as absolute names."""
    names = set()
    package = ".".join(("lightning_hybrid", *path.relative_to(PACKAGE).parent.parts))
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                names.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                names.add(node.module)
                names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def part_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    known = {part_of(p) for p in MODULES}
    for path in MODULES:
        source = part_of(path)
        for name in imported_modules(path):
            pieces = name.split(".")
            if pieces[0] == "lightning_hybrid" and len(pieces) > 1 and pieces[1] in known and pieces[1] != source:
                graph.setdefault(source, set()).add(pieces[1])
    return graph


def test_the_parts_are_the_ones_the_layers_name():
    parts = {part_of(p) for p in MODULES} - {"__init__"}
    assert parts == ALGORITHMS | GLUE, parts ^ (ALGORITHMS | GLUE)


def test_no_import_cycle_between_parts():
    graph = part_graph()
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, route = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    pytest.fail("import cycle between parts: " + " -> ".join(route + [nxt]))
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, route + [nxt]))


@pytest.mark.parametrize("path", [p for p in MODULES if part_of(p) in ALGORITHMS], ids=lambda p: str(p.relative_to(PACKAGE)))
def test_algorithms_import_neither_lightning_nor_the_glue(path):
    for name in imported_modules(path):
        pieces = name.split(".")
        assert pieces[0] not in LIGHTNING, f"{name}: an algorithm module imports Lightning"
        assert not (pieces[0] == "lightning_hybrid" and len(pieces) > 1 and pieces[1] in GLUE), f"imports glue: {name}"


def test_nothing_outside_the_cli_imports_it():
    for path in MODULES:
        mirror_of_cli = path.relative_to(PACKAGE).parts[:2] == ("lightning", "cli")  # shares the cli's plain modules
        if part_of(path) != "cli" and not mirror_of_cli:
            assert not any(n.startswith("lightning_hybrid.cli") for n in imported_modules(path)), path


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_module_is_short_and_says_what_it_holds(path):
    text = path.read_text()
    if part_of(path) != "lightning":  # hand-written; the generated mirror is its source and a header line
        assert len(text.splitlines()) <= MAX_LINES, f"{len(text.splitlines())} lines: split it by concept"
    assert ast.get_docstring(ast.parse(text)), "no opening docstring saying what the module holds"


def test_architecture_md_lists_every_module():
    """ARCHITECTURE.md as the code is: every module of the package (but the generated ``lightning/``) in its
    index, and no module there that is gone."""
    text = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    listed = set(re.findall(r"^\| `([\w/]+\.py)` \|", text, flags=re.MULTILINE))
    modules = {str(p.relative_to(PACKAGE)) for p in MODULES if part_of(p) != "lightning" and str(p.relative_to(PACKAGE)) != "__init__.py"}
    assert not modules - listed, f"add to ARCHITECTURE.md's index: {sorted(modules - listed)}"
    assert not listed - modules, f"gone from the package, still in ARCHITECTURE.md: {sorted(listed - modules)}"


#: The most classes of ours a strategy's method resolution order may hold (issue 63).
MAX_OWN_BASES = 4


def strategy_rows() -> list[str]:
    """ARCHITECTURE.md's table of the strategies, from the code: each strategy's classes of ours (below it),
    whether it keeps DDP's wrapper, the suite's hooks and answers it overrides (``StrategyHooks``,
    ``Capabilities``) and Lightning's methods it overrides."""
    from pytorch_lightning.strategies import DDPStrategy

    import lightning_hybrid.strategies as strategies
    from lightning_hybrid.strategies.capabilities import Capabilities, StrategyHooks
    from lightning_hybrid.strategies.checked_ddp import CheckedDDPStrategy

    suite = {n for n in vars(StrategyHooks) if not n.startswith("_")} | {n for n in vars(Capabilities) if not n.startswith("_")}
    rows = []
    for name in sorted(n for n in strategies.__all__ if n.endswith("Strategy")):
        cls = getattr(strategies, name)
        ours = [k for k in cls.__mro__ if k.__module__.startswith("lightning_hybrid")]
        defined = set().union(*(vars(k) for k in ours if k not in (CheckedDDPStrategy, Capabilities)))
        hooks = sorted(n for n in defined if n in suite)
        lightning = sorted(n for n in defined if hasattr(DDPStrategy, n) and n not in suite and not n.startswith("__")
                           and n != "_abc_impl")
        rows.append(f"| `{name}` | {len(ours)}: {' → '.join(k.__name__ for k in ours[1:])} | "
                    f"{'yes' if cls.wraps_model else 'no'} | {', '.join(hooks)} | {', '.join(lightning)} |")
    return rows


def test_no_strategy_stands_on_more_than_four_classes_of_ours_and_the_table_says_what_each_overrides():
    """One base (``CheckedDDPStrategy``, with ``Capabilities``), at most one layer of ours between it and a
    strategy (the parameter server's, the rank states', the stage state's): composition where order would matter.
    ARCHITECTURE.md's table is what :func:`strategy_rows` reads from the code."""
    rows = strategy_rows()
    deep = [row for row in rows if int(row.split("|")[2].split(":")[0]) > MAX_OWN_BASES]
    assert not deep, f"strategies on more than {MAX_OWN_BASES} classes of ours: {deep}"
    text = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    table = [line for line in text.splitlines() if re.match(r"^\| `\w+Strategy` \|", line)]
    assert table == rows, "ARCHITECTURE.md's table of the strategies differs from the code; its rows are:\n" + "\n".join(rows)


def test_no_two_modules_share_a_stem():
    """A module's name says what it holds wherever it is read (a traceback, a log line, a search): two modules of one
    name (``comm/local_sgd.py`` and ``strategies/local_sgd.py`` were) are renamed (issue 63)."""
    stems: dict[str, list[str]] = {}
    for path in MODULES:
        if part_of(path) != "lightning" and path.name != "__init__.py":
            stems.setdefault(path.stem, []).append(str(path.relative_to(PACKAGE)))
    shared = {stem: paths for stem, paths in stems.items() if len(paths) > 1}
    assert not shared, f"modules sharing a stem: {shared}"


def test_the_tests_mirror_the_package():
    """``tests/`` mirrors the package: a folder a subpackage of ``lightning_hybrid`` names, or ``repository`` (the
    repository as a whole: pages, figures, packaging), ``support`` (helpers and scripts the tests run) or ``gpu``;
    no two test files share a name (pytest imports them by it)."""
    tests = PACKAGE.parent / "tests"
    allowed = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()} - {"lightning"}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert not folders - allowed - {"repository", "support", "gpu"}, f"test folders no package names: {folders - allowed}"
    files = [p for p in tests.rglob("test_*.py")]
    names = [p.name for p in files]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    assert not [p for p in tests.glob("*.py") if not p.name.startswith("test_") and p.name != "conftest.py"], \
        "helpers and scripts live in tests/support/"
