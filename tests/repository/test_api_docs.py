"""The API reference: every exported name has an entry in docs/api.md and a docstring example that runs."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

import lightning_hybrid

API_PAGE = Path(__file__).resolve().parents[2] / "docs" / "api.md"
CLASSES = [name for name in lightning_hybrid.__all__ if name != "__version__"]


def test_every_exported_name_has_an_api_entry() -> None:
    page = API_PAGE.read_text()
    entries = set(re.findall(r"^::: lightning_hybrid\.(\w+)\s*$", page, flags=re.MULTILINE))
    missing = [name for name in CLASSES if name not in entries]
    assert not missing, f"docs/api.md has no `::: lightning_hybrid.NAME` entry for {missing}"
    assert re.search(r"^::: lightning_hybrid\s*$", page, flags=re.MULTILINE), "the package's own entry (it documents __version__)"
    assert "__version__" in page


def run_examples(obj: object, name: str) -> doctest.TestResults:
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(obj, name, globs={}):
        runner.run(test)
    return runner.summarize(verbose=False)


@pytest.mark.parametrize("name", CLASSES)
def test_each_exported_class_has_a_docstring_example_that_runs(name: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # a Trainer built by an example writes nothing into the repository
    obj = getattr(lightning_hybrid, name)
    assert "Examples:" in (obj.__doc__ or ""), f"{name}'s docstring has no `Examples:` section"
    results = run_examples(obj, name)
    assert results.attempted >= 3, f"{name}'s example runs {results.attempted} statements"
    assert results.failed == 0, f"{name}'s docstring example fails (see the doctest output above)"


def test_the_package_docstring_example_shows_the_version() -> None:
    assert "__version__" in lightning_hybrid.__doc__
    results = run_examples(lightning_hybrid, "lightning_hybrid")
    assert results.attempted >= 2 and results.failed == 0


STRATEGY_PAGES = {"ssp": "SSPStrategy", "cneural": "CNeuralStrategy", "delayed-averaging": "DelayedAveragingStrategy",
                  "balanced": "BalancedDataParallelStrategy", "hybrid": "HybridParallelStrategy",
                  "partitioned-inference": "PartitionedInferenceStrategy"}


@pytest.mark.parametrize("page, name", sorted(STRATEGY_PAGES.items()))
def test_every_setting_of_a_strategy_is_on_its_page(page, name) -> None:
    """Every constructor argument a strategy takes, its own and the suite's bases', is on its page with its
    default: its own rendered there (``:::``), the inherited ones named with their defaults and linked to
    their class's entry in docs/api.md, whose docstring explains each (Args)."""
    import inspect

    text = (API_PAGE.parent / "strategies" / f"{page}.md").read_text()
    api = API_PAGE.read_text()
    cls = getattr(lightning_hybrid, name)
    assert f"::: lightning_hybrid.{name}\n" in text
    for base in cls.__mro__:
        if not base.__module__.startswith("lightning_hybrid") or "__init__" not in vars(base):
            continue
        parameters = {n: p for n, p in inspect.signature(base.__init__).parameters.items() if n not in ("self", "args", "kwargs")}
        doc = inspect.getdoc(base) or ""
        if base is cls:  # rendered on the page from its docstring
            missing = [n for n in parameters if not re.search(rf"^\s+{n}\b[^:\n]*:", doc, re.M)]
            assert not missing, f"{name}'s docstring does not explain {missing}"
            continue
        assert re.search(rf"^::: [\w.]*\.{base.__name__}$", api, re.M), f"docs/api.md does not render {base.__name__}"
        assert "../api.md#lightning_hybrid.strategies." in text and base.__name__ in text, f"{page}.md: no link to {base.__name__}"
        for setting, parameter in parameters.items():
            assert re.search(rf"^\s+{setting}\b[^:\n]*:", doc, re.M), f"{base.__name__}'s docstring does not explain {setting}"
            assert f"`{setting}" in text, f"docs/strategies/{page}.md does not name {base.__name__}'s setting {setting}"
            if parameter.default is not inspect.Parameter.empty and setting not in (
                    "accelerator", "parallel_devices", "cluster_environment", "precision_plugin"):
                assert f"`{setting}={parameter.default!r}`" in text, f"{page}.md: {setting}'s default {parameter.default!r}"
