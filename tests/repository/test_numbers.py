"""The figures of the strategy table (README.md and the site's docs/_snippets/strategy_table.md) come
from the tables they summarise: paper 000's recipe (the LeNet-5 grid at 98 %, whose persistent rows give
the ranges, and its rerun with learning curves, quoted beside the grid without stragglers), the hybrid
page's benchmark table and the slow-link table on the delayed all-reduce's page. A rerun that changes a
table fails here until the summary says the same. tests/repository/test_quoted_figures.py ties every other page that
quotes these figures to the same rows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ZHANG = (ROOT / "recipes" / "zhang2017_delay_sync" / "README.md").read_text()
HYBRID = (ROOT / "docs" / "strategies" / "hybrid.md").read_text()
LINK = (ROOT / "docs" / "strategies" / "delayed-averaging.md").read_text()
SUMMARIES = [ROOT / "README.md", ROOT / "docs" / "_snippets" / "strategy_table.md"]


def table_after(text: str, marker: str) -> list[dict[str, str]]:
    """The first Markdown table after the line starting with ``marker``, as rows of {header: cell}; an
    empty first cell repeats the one above (the hybrid table's scenarios)."""
    lines = text[text.index(marker):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    block = [line for line in lines[start:] if line.startswith("|")][: next(
        (i for i, line in enumerate(lines[start:]) if not line.startswith("|")), None)]
    header, rows, last = [c.strip() for c in block[0].strip("|").split("|")], [], ""
    for line in block[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        last = cells[0] or last
        rows.append(dict(zip(header, [last, *cells[1:]])))
    return rows


def span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}x"


def factor(cell: str) -> float:
    return float(re.match(r"([\d.]+)x", cell).group(1))


def expected_figures() -> dict[str, list[str]]:
    grid, rerun = table_after(ZHANG, "LeNet-5, 98 %:"), table_after(ZHANG, "Its summary (")
    persistent = [r for r in grid if r["scenario"].endswith("_persistent")]
    (none,) = [r for r in grid if r["scenario"] == "none"]
    (rerun_none,) = [r for r in rerun if r["scenario"] == "none"]
    # the pipeline at its defaults: on ranks of two speeds (2 ranks, and 4 as CPU shares), on 2 equal ranks, between hosts
    hybrid = [r for r in table_after(HYBRID, "### Against what you would pick instead") if r["vs DDP"]]
    two_speeds = [r for r in hybrid if r["scenario"] in ("speeds [1, 2]", "speeds [1, 1, 2, 2], CPU shares")
                  and r["contender"] == "hybrid"]
    equal = {r["contender"]: r for r in hybrid if r["scenario"] == "2 equal ranks"}
    (tcp,) = [r for r in table_after(HYBRID, "| link | contender | ms a sample") if r["link"] == "1 Gbit/s"
              and r["contender"] == "hybrid"]
    link = {r["contender"]: r for r in table_after(LINK, "Time to 98 % measured end to end under each source")}

    def vs_ddp(contender: str, source: str) -> str:
        return re.search(r"\) ([\d.]+x),", link[contender][f"{source}: s (range) x DDP, reached"]).group(1)

    line = {(r["round trip"], r["contender"]): r["x DDP"]
            for r in table_after(LINK, "| round trip | contender | lr | seconds to target")}

    return {
        "DelayedAveragingStrategy": [f"{line[('50 ms', 'dga_d4')]} sooner through a real 50 ms round trip",
                                  f"{line[('200 ms', 'dga_d4')]} through 200 ms",
                                  f"{vs_ddp('dga_d2', '100mbit')} at 100 Mbit/s",
                                  f"{vs_ddp('dga_d2', 'unshaped')} unshaped"],
        "LocalSGDStrategy": [f"{vs_ddp('local_h32', '100mbit')} sooner at 100 Mbit/s",
                             f"{vs_ddp('local_h64', '10mbit')} at 10 Mbit/s",
                             f"{line[('200 ms', 'local_h32')]} sooner through a real 200 ms round trip"],
        "BalancedDataParallelStrategy": [f"{span([factor(r['balanced']) for r in persistent])} sooner with one rank slow",
                                         f"({none['balanced']} in the grid, {rerun_none['balanced']} in a rerun)"],
        "SSPStrategy": [f"{span([factor(r['ssp']) for r in persistent])} sooner with one rank slow",
                        f"({none['ssp']} in the grid, {rerun_none['ssp']} in a rerun)"],
        "HybridParallelStrategy": [
            f"of different speeds {span([factor(r['vs DDP']) for r in two_speeds])} DDP and "
            f"{span([factor(r['vs FSDP']) for r in two_speeds])} FSDP",
            f"on 2 equal ranks {equal['hybrid']['vs DDP']} DDP (balanced: {equal['balanced']['vs DDP']})",
            f"through a 1 Gbit/s link as between hosts {tcp['vs DDP']} DDP"],
    }


@pytest.mark.parametrize("summary", SUMMARIES, ids=lambda p: p.name)
def test_the_strategy_table_s_figures_are_the_source_tables(summary):
    rows = {re.search(r"`(\w+Strategy)`", line).group(1): line for line in summary.read_text().splitlines()
            if line.startswith("| [`")}
    for strategy, figures in expected_figures().items():
        for figure in figures:
            assert figure in rows[strategy], f"{summary.name}, {strategy}: expected {figure!r} in {rows[strategy]!r}"


def test_the_readme_and_the_site_show_the_same_table():
    def figures(path: Path) -> list[str]:
        return [line.rsplit("|", 2)[-2] for line in path.read_text().splitlines() if line.startswith("| [`")]

    assert figures(SUMMARIES[0]) == figures(SUMMARIES[1])


def test_the_straggler_reports_advice_quotes_the_grid():
    """Every figure the straggler report prints comes from the grid's 'LeNet-5, 98 %' table it names."""
    from lightning_hybrid.straggler_analysis import ADVICE, MEASURED, SOURCE

    assert "'LeNet-5, 98 %'" in SOURCE
    rows = {r["scenario"]: r for r in table_after(ZHANG, "LeNet-5, 98 %:")}

    def of(pattern: str, contenders: str, sources: str | None = None) -> tuple[float, float]:
        wanted = [f"{src}_{pattern}" if pattern != "none" else "none"
                  for src in (sources.split(",") if sources else ("compute", "after_step", "data", "contention"))]
        values = [factor(rows[scenario][c]) for scenario in dict.fromkeys(wanted) for c in contenders.split(",")]
        return min(values), max(values)

    for key, figures in MEASURED.items():
        pattern, contenders, *sources = key.split("/")
        assert figures == of(pattern, contenders, *sources), key
    assert all(f"{low:.2f}-{high:.2f}x" in " ".join(ADVICE.values()) for low, high in MEASURED.values())


def test_the_straggler_reports_transient_advice_quotes_the_slow_link_table():
    from lightning_hybrid.straggler_analysis import ADVICE, FAMILY_SOURCE, FAMILY_TRANSIENT

    assert "'Time to 98 % measured end to end under each source'" in FAMILY_SOURCE
    rows = {r["contender"]: r for r in table_after(LINK, "Time to 98 % measured end to end under each source")}
    for contender, figure in FAMILY_TRANSIENT.items():
        cell = rows[contender]["stragglers: s (range) x DDP, reached"]
        assert factor(re.search(r"\) ([\d.]+x), 3/3", cell).group(1)) == figure, cell
        assert f"{figure:.2f}x" in ADVICE["transient"]


def test_the_latency_bound_advice_quotes_the_idle_restart_table():
    from lightning_hybrid.comm.regime import IDLE_RESTART_COST, IDLE_RESTART_COST_200MS

    rows = table_after(LINK, "TCP's slow start after idle, the line's steps with and without it")
    ratios = [factor(r["default over none"]) for r in rows if r["round trip"] == "50 ms" and r["contender"] != "ddp"]
    assert len(ratios) == 3 and IDLE_RESTART_COST == f"{min(ratios):.2f}-{max(ratios):.2f}x"
    long = [factor(r["default over none"]) for r in rows if r["round trip"] == "200 ms"]
    assert len(long) == 4 and IDLE_RESTART_COST_200MS == f"{min(long):.2f}-{max(long):.2f}x"
    assert f"at 200 ms {IDLE_RESTART_COST_200MS}" in (ROOT / "docs" / "straggler-report.md").read_text()
    assert f"steps\n  {IDLE_RESTART_COST} longer" in (ROOT / "docs" / "straggler-report.md").read_text()
