"""The documentation site builds with `mkdocs build --strict`, and the README stays its front door."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import shared_folder

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site as `mkdocs build --strict` writes it (the test fails, rather than skips, when the build does)."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed (pip install -e '.[docs]')")
    pytest.importorskip("mkdocstrings_handlers.python", reason="mkdocstrings-python is not installed")

    def build(out: Path) -> None:
        result = subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
            cwd=REPO, capture_output=True, text=True, timeout=240, env={**_env(), "NO_MKDOCS_2_WARNING": "1"},
        )
        warnings = [line for line in result.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
        assert result.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(warnings or [result.stderr[-3000:]])

    return shared_folder(tmp_path_factory, "docs_site", build)


def test_the_site_builds_strictly(site: Path) -> None:
    built = {p.relative_to(site).as_posix() for p in site.rglob("*.html")}
    pages = {p.relative_to(REPO / "docs").with_suffix(".html").as_posix()
             for p in (REPO / "docs").rglob("*.md") if "_snippets" not in p.parts}
    assert pages <= built, f"pages not built: {sorted(pages - built)}"
    # Every exported name rendered on the API page, with its example.
    api = (site / "api.html").read_text()
    for name in ("SSPStrategy", "CNeuralStrategy", "DelayedAveragingStrategy", "BalancedDataParallelStrategy",
                 "HybridParallelStrategy", "PartitionedInferenceStrategy", "ClassifierModule"):
        assert f'id="lightning_hybrid.{name}"' in api, f"{name} has no entry on the built API page"
    assert api.count("Examples:") + api.count(">Examples<") >= 7


@pytest.mark.timeout(900)  # one headless Chromium per page: about 80 s on 2 idle cores
def test_every_page_loads_in_chromium_without_a_broken_link_or_image(site: Path, check_site, capsys) -> None:
    """tools/check_site.py over the built site: what `python tools/check_site.py site/` checks by hand."""
    status = check_site.main([str(site)])
    report = capsys.readouterr().out
    assert status == 0, report
    assert re.search(r"(\d+) pages loaded", report) and int(re.search(r"(\d+) pages loaded", report)[1]) >= 20, report


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def _table(text: str) -> list[list[str]]:
    """The strategy table's rows, links reduced to their text."""
    start = text.index("| strategy | alias | pick it when")
    rows = []
    for line in text[start:].splitlines():
        if not line.startswith("|"):
            break
        rows.append([re.sub(r"\[(.*?)\]\([^)]*\)", r"\1", cell).strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_readme_is_a_front_door() -> None:
    readme = (REPO / "README.md").read_text()
    lines = readme.splitlines()
    assert len(lines) < 150, f"README.md has {len(lines)} lines; the manual belongs in docs/"
    # The two set-up commands come first, then the strategy table within the first screen (~60 lines).
    commands = [i for i, line in enumerate(lines) if line.startswith("python3 -m venv .venv")]
    assert len(commands) == 2 and commands[1] < 10, "the README starts with the two set-up commands"
    table_line = next(i for i, line in enumerate(lines) if line.startswith("| strategy | alias | pick it when"))
    assert table_line < 40
    # ... and says the same as the docs' table.
    assert _table(readme) == _table((REPO / "docs" / "_snippets" / "strategy_table.md").read_text())
    # Its links into docs/ and the repository point at files that exist.
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if "://" not in target:
            assert (REPO / target).exists(), f"README links to {target}, which does not exist"


def test_recipe_pages_lead_with_their_result_and_stay_short():
    """A recipe's README is what a reader opens: the current result and its command, at most 300 lines;
    superseded runs live beside it (HISTORY.md) or in the changelog."""
    for readme in sorted((REPO / "recipes").glob("*/README.md")):
        lines = readme.read_text().count("\n")
        assert lines <= 300, f"{readme.relative_to(REPO)} has {lines} lines: move superseded runs to a HISTORY.md beside it"


def test_the_cli_page_lists_every_config_of_every_group() -> None:
    """docs/cli.md's table of config groups names each option a user can pick (a new config shows up there)."""
    page = (REPO / "docs" / "cli.md").read_text()
    rows = {line.split("|")[1].strip().strip("`"): line for line in page.splitlines() if line.startswith("| `")}
    missing = {}
    for group in ("data", "model", "optimizer", "scheduler", "strategy", "trainer", "sim", "logger", "callbacks", "experiment"):
        options = sorted(p.stem for p in (REPO / "configs" / group).glob("*.yaml"))
        absent = [o for o in options if f"`{o}`" not in rows.get(group, "") and not (o in ("none", "default") and group != "sim")]
        if absent:
            missing[group] = absent
    assert not missing, f"docs/cli.md's table lacks {missing}"
