"""The API reference: every exported name has an entry in docs/api.md and a docstring example that runs."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

import lightning_hybrid

API_PAGE = Path(__file__).resolve().parent.parent / "docs" / "api.md"
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
