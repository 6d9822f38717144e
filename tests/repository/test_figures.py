"""Every measured figure on every page comes from a results table: a ratio (``1.27x``) or a three-decimal
metric (``0.788``) written in the prose of the README, the docs or a recipe must be a number of one of
the results tables (the pages' Markdown tables and the recipes' HISTORY.md files, which keep superseded
measurements), to the precision the prose gives. A figure that is not a measurement is declared below,
as what it is: arithmetic (checked by its formula), a paper's figure, a setting, or a sample of the
report's output. A rerun that changes a table, or a page quoting a figure no table holds, fails here.
Code blocks (commands, printed output) and the generated config reference are not prose."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "recipes").rglob("README.md"))]
PAGES = [p for p in PAGES if p.name != "configs.md"]  # generated from the configs: keys and defaults
HISTORIES = sorted((ROOT / "recipes").rglob("HISTORY.md"))
#: A measured figure: a ratio, or a metric with three decimals.
FIGURE = re.compile(r"(?<![\w.])(\d+\.\d+)x\b|(?<![\w.\d])(0\.\d{3})(?!\d)")
NUMBER = re.compile(r"(?<![\w.])(\d+\.\d+)")
PAPERS = ROOT.parent / "shared" / "papers"

#: Figures in prose that are not measurements: (page, figure, what it is, its formula for arithmetic).
NOT_MEASURED = [
    ("docs/adni.md", "0.574", "arithmetic: always answering sMCI on 172 pMCI and 232 sMCI", 232 / 404),
    ("docs/strategies/ssp.md", "0.897", "arithmetic: mu'/(1-mu') = 0.9/0.1 - 0.25", 8.75 / 9.75),
    ("recipes/mao2017_modnn/README.md", "1.86x", "arithmetic on paper 001's 2-worker row: 15809 ms against 8509 ms", 15809 / 8509),
    ("recipes/mao2017_modnn/README.md", "4.28x", "paper 001's compute speed-up with 2-4 workers", None),
    ("recipes/zhang2017_delay_sync/README.md", "0.025", "a setting: the learning rate of the earliest numbers", None),
    ("docs/straggler-report.md", "0.004", "a sample of the report's line (how to read it)", None),
    ("docs/straggler-report.md", "0.154", "a sample of the report's line (how to read it)", None),
    ("docs/strategies/index.md", "0.004", "a sample of the report's line", None),
    ("docs/strategies/index.md", "0.154", "a sample of the report's line", None),
    ("docs/strategies/hybrid.md", "0.861", "a sample of the placement's log line (speeds [1, 2], the first run's)", None),
    ("docs/strategies/hybrid.md", "0.854", "a predicted step from a run's log line (the third contention run's)", None),
]


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the text outside tables and fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and not line.startswith("|"):
            lines.append((number, line))
    return lines


def table_numbers() -> list[float]:
    return [float(m.group(1)) for page in [*PAGES, *HISTORIES] for line in page.read_text().splitlines()
            if line.startswith("|") for m in NUMBER.finditer(line)]


def in_a_table(figure: str, numbers: list[float]) -> bool:
    decimals = len(figure.split(".")[1])
    return any(abs(round(n, decimals) - float(figure)) < 1e-9 for n in numbers)


def figures_in_prose() -> list[tuple[str, int, str]]:
    return [(str(page.relative_to(ROOT)), number, (m.group(1) + "x") if m.group(1) else m.group(2))
            for page in PAGES for number, line in prose(page.read_text()) for m in FIGURE.finditer(line)]


def test_every_figure_in_prose_is_in_a_results_table_or_declared():
    numbers = table_numbers()
    declared = {(page, figure) for page, figure, _, _ in NOT_MEASURED}
    unsupported = [f"{page}:{line}: {figure}" for page, line, figure in figures_in_prose()
                   if (page, figure) not in declared and not in_a_table(figure.rstrip("x"), numbers)]
    assert not unsupported, ("figures that no results table holds (put the measurement in its table, or quote "
                             f"the table's figure, or say what else it is in NOT_MEASURED): {unsupported}")
    assert len(figures_in_prose()) > 150, "the pages' figures were not found: the pattern is broken"


@pytest.mark.parametrize("page, figure, what, value", NOT_MEASURED, ids=[f"{p}:{f}" for p, f, _, _ in NOT_MEASURED])
def test_a_declared_figure_is_on_its_page_and_its_arithmetic_holds(page, figure, what, value):
    assert figure in (ROOT / page).read_text(), f"{page} no longer shows {figure}: remove it from NOT_MEASURED"
    if value is not None:
        decimals = len(figure.rstrip("x").split(".")[1])
        assert round(value, decimals) == float(figure.rstrip("x")), f"{page}: {figure} is not {what} ({value:.4f})"
    if what.startswith("paper 001") and PAPERS.is_dir():
        (text,) = [p.read_text() for p in PAPERS.glob("001_*.txt")]
        assert figure.rstrip("x") in text, f"paper 001 does not say {figure}"


def test_a_figure_no_table_holds_fails_the_check():
    numbers = table_numbers()
    assert in_a_table("1.27", numbers) and not in_a_table("9.87", numbers)
    assert [m.group(0) for m in FIGURE.finditer("at 1.27x and 0.788 (AUC 0.9, lr 0.0250, 12.5x)")] == ["1.27x", "0.788", "12.5x"]
