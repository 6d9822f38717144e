"""A figure quoted on several pages is one figure: each entry of FIGURES ties a quoted figure to ONE source,
the table cells it is read or computed from (a page, the line its table follows, the rows, the columns), or,
for a figure no table holds, the one place that states it; and it lists every place that quotes it (a page
and a regular expression whose group is the figure). Every quoting place must say exactly the source's
figure: a rerun that changes a table, or a page edited to say something else, fails here, naming the page,
the line and the source row. A range (``1.55-2.26x``) is the minimum and maximum of its cells.

The pages that quote (the README's strategy table, the site's copy of it, the strategy and recipe indexes,
the strategy pages' "Pick it when" paragraphs, benchmarks/README.md's paragraphs that quote a strategy or recipe page)
are scanned: every ratio on them (``N.NNx``, ``N.NN-N.NNx``) must be a registered quote, or be declared in
NOT_QUOTES as what else it is. tests/repository/test_figures.py checks that every figure in prose is in some table;
this file checks that it is the right row's, and the same everywhere."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAPERS = ROOT.parent / "shared" / "papers"

#: A quoted ratio or range of ratios, as a regex group: 1.84x, 1.55-2.26x, 0.86x-1.24x.
F = r"(\d+\.\d+(?:x?-\d+\.\d+)?x)"
#: A ratio or a range of ratios anywhere in a text (what the scan looks for).
RATIO = re.compile(r"(?<![\w.])\d+\.\d+(?:x-\d+\.\d+x|-\d+\.\d+x|x)(?!\w)")


@functools.cache
def read(page: str) -> str:
    return (ROOT / page).read_text()


def normal(figure: str) -> str:
    """``0.86x-1.24x`` and ``0.86-1.24x`` are the same range."""
    return re.sub(r"x-", "-", figure.strip())


def line_of(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1


def table(text: str, marker: str) -> list[list[str]]:
    """The first Markdown table from the line starting with ``marker`` on (the marker may be the table's
    header line), as [header, *rows] of cells without bold; an empty first cell repeats the one above."""
    found = re.search(r"^" + re.escape(marker), text, re.MULTILINE)
    assert found, f"no line starts with {marker!r}"
    lines = text[found.start():].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    block = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        block.append([cell.strip().replace("**", "") for cell in line.strip().strip("|").split("|")])
    header, rows, last = block[0], [], ""
    for cells in block[2:]:
        last = cells[0] or last
        rows.append([last, *cells[1:]])
    return [header, *rows]


def span(figures: list[str]) -> str:
    """One ratio, or the range from the smallest to the largest (as the cells write them)."""
    ordered = sorted(figures, key=lambda f: float(f.rstrip("x")))
    low, high = ordered[0], ordered[-1]
    return low if float(low.rstrip("x")) == float(high.rstrip("x")) else f"{low.rstrip('x')}-{high}"


@dataclass(frozen=True)
class Cells:
    """Cells of one table: the rows whose first cells fully match ``rows`` (one pattern per leading column),
    in ``columns``. ``how``: ``ratio`` (each cell's first ``N.NNx``; several cells make a range), ``times``
    (each cell's number, as a ratio), ``cell`` (the one cell, as written)."""

    page: str
    table: str
    rows: tuple[str, ...]
    columns: tuple[str, ...]
    how: str = "ratio"

    def cells(self) -> list[str]:
        header, *rows = table(read(self.page), self.table)
        missing = [c for c in self.columns if c not in header]
        assert not missing, f"{self.page}, table after {self.table!r}: no column {missing} in {header}"
        chosen = [row for row in rows if all(re.fullmatch(p, cell) for p, cell in zip(self.rows, row))]
        assert chosen, f"{self.page}, table after {self.table!r}: no row matches {self.rows}"
        return [row[header.index(c)] for row in chosen for c in self.columns]

    def figure(self) -> str:
        cells = self.cells()
        if self.how == "cell":
            (cell,) = cells
            return cell
        if self.how == "times":
            return span([re.match(r"[\d.]+", c).group(0) + "x" for c in cells])
        return span([re.search(r"\d+\.\d+x", c).group(0) for c in cells])

    def __str__(self) -> str:
        return f"{self.page}, the table after {self.table!r}, rows {self.rows}, columns {self.columns}"


@dataclass(frozen=True)
class Quotient:
    """Row by row, the number in one table's cells over the number in the same table's other cells."""

    numerator: Cells
    denominator: Cells

    def figure(self) -> str:
        number = re.compile(r"[\d.]+")
        pairs = zip(self.numerator.cells(), self.denominator.cells(), strict=True)
        return span([f"{float(number.match(n).group(0)) / float(number.match(d).group(0)):.2f}x" for n, d in pairs])

    def __str__(self) -> str:
        return f"({self.numerator}) over ({self.denominator})"


@dataclass(frozen=True)
class Stated:
    """A figure no table holds, stated in one place: the one match of ``pattern`` on ``page``."""

    page: str
    pattern: str

    def figure(self) -> str:
        matches = list(re.finditer(self.pattern, read(self.page)))
        assert len(matches) == 1, (f"{self.page} states {self.pattern!r} {len(matches)} times: a figure no table "
                                   "holds is stated in exactly one place (moved it? point its entry in FIGURES there)")
        return matches[0].group(1)

    def __str__(self) -> str:
        return f"{self.page}: {self.pattern!r}"


@dataclass(frozen=True)
class Quote:
    """A place that quotes the figure: every match of ``pattern`` (its group is the figure) on ``page``;
    ``optional``: the page may leave it out (point elsewhere) but, where it says it, says the same."""

    page: str
    pattern: str
    optional: bool = False


@dataclass(frozen=True)
class Figure:
    name: str
    source: Cells | Quotient | Stated
    quotes: tuple[Quote, ...] = field(default=())


README, SNIPPET = "README.md", "docs/_snippets/strategy_table.md"
INDEX, RECIPES = "docs/strategies/index.md", "docs/recipes/index.md"
BALANCED, SSP, HYBRID = "docs/strategies/balanced.md", "docs/strategies/ssp.md", "docs/strategies/hybrid.md"
ASGD, LOCAL = "docs/strategies/delayed-averaging.md", "docs/strategies/local-sgd.md"
FSDP = "docs/strategies/fsdp2.md"
REPORT, BENCH = "docs/straggler-report.md", "benchmarks/README.md"
ZHANG, ADNI = "recipes/zhang2017_delay_sync/README.md", "recipes/akintoye2022_hybrid_adni/README.md"
MODNN = "recipes/mao2017_modnn/README.md"

GRID, RERUN = "LeNet-5, 98 %:", "Its summary ("
LINK, LINK_SAMPLES = "Time to 98 % under each source, the quotient (computed", "Samples to 98 %:"
#: The shaped links' and stragglers' table measured end to end (docs/strategies/delayed-averaging.md).
E2E = "Time to 98 % measured end to end under each source"
HYBRID_TABLE, PLACEMENT = "### Against what you would pick instead", "## `hybrid_placement.py`"
HYBRID_SWEEP = "#### The sweep behind the defaults"
HYBRID_LINK = "| link | contender | ms a sample"
WHOLE_BRAIN = "At 2 mm (80 x 104 x 88):"
LATENCY = "| contender | latency ms"
LONG = "| round trip | contender | lr | seconds to target"
STEP = "| round trip | contender | line | simulator"


def grid(rows: str, *columns: str) -> Cells:
    return Cells(ZHANG, GRID, (rows,), columns)


def rerun(rows: str, *columns: str) -> Cells:
    return Cells(ZHANG, RERUN, (rows,), columns)


def link(contenders: str, *sources: str) -> Cells:
    return Cells(ASGD, LINK, (contenders,), tuple(f"{s}: s (x DDP)" for s in sources))


def e2e(contenders: str, *sources: str) -> Cells:
    """The end-to-end table through shaped links and under stragglers: DDP's median time over the contender's."""
    return Cells(ASGD, E2E, ("ddp|powersgd_r2|dga_d2|local_h32|local_h64" if contenders == "*" else contenders,),
                 tuple(f"{s}: s (range) x DDP, reached" for s in sources))


def line(round_trip: str, contender: str) -> Cells:
    """The delayed all-reduce page's end-to-end table through the delay line: DDP's time over the contender's."""
    return Cells(ASGD, LONG, (round_trip, contender), ("x DDP",))


def over_ddp(table: str, round_trip: str, contender: str, column: str, ddp_over: bool = False) -> Quotient:
    """A contender's cell over DDP's in the same column of a long-link table (``ddp_over``: DDP's over its)."""
    mine, ddp = (Cells(ASGD, table, (round_trip, name), (column,), how="cell") for name in (contender, "ddp"))
    return Quotient(ddp, mine) if ddp_over else Quotient(mine, ddp)


def hybrid(scenarios: str, contender: str) -> Cells:
    return Cells(HYBRID, HYBRID_TABLE, (scenarios, contender), ("vs DDP",))


def sweep(scenarios: str, contender: str) -> Cells:
    return Cells(HYBRID, HYBRID_SWEEP, (scenarios, contender), ("vs DDP",))


def in_table(strategy: str, pattern: str) -> tuple[Quote, Quote]:
    """The strategy's row of the README's table and of the site's copy."""
    return tuple(Quote(page, rf"`{strategy}`.*?" + pattern) for page in (README, SNIPPET))


PERSISTENT, TRANSIENT = r".*_persistent", r".*_transient"
TWO_RANKS = r"2 equal ranks|speeds \[1, 2\]|real contention on rank 1"
SHARES = r"speeds \[1, 1, 2, 2\], CPU shares"
TWO_SPEEDS = r"speeds \[1, 2\]|speeds \[1, 1, 2, 2\], CPU shares"

FIGURES = [
    # Paper 000's grid (recipes/zhang2017_delay_sync), LeNet-5 to 98 %: balanced and SSP under stragglers.
    Figure("balanced, persistent straggler", grid(PERSISTENT, "balanced"), (
        *in_table("BalancedDataParallelStrategy", rf"98 % on MNIST {F} sooner with one rank slow"),
        Quote(INDEX, rf"strategy=balanced: {F} DDP's time"), Quote(REPORT, rf"strategy=balanced: {F} DDP's time"),
        Quote(INDEX, rf"in the grid `balanced` {F} and `ssp`"))),
    Figure("ssp, persistent straggler", grid(PERSISTENT, "ssp"), (
        *in_table("SSPStrategy", rf"\| {F} sooner with one rank slow"),
        Quote(INDEX, rf"\(ssp: {F}\)"), Quote(REPORT, rf"\(ssp: {F}\)"), Quote(INDEX, rf"and `ssp`\s+{F}, `balanced` ahead"))),
    Figure("balanced, no straggler", grid("none", "balanced"), (
        *in_table("BalancedDataParallelStrategy", rf"without stragglers \({F} in the grid"),
        Quote(INDEX, rf"put `balanced` at {F} DDP"), Quote(BALANCED, rf"DDP's time \({F} in the grid"),
        Quote(ZHANG, rf"Without\s+stragglers {F} \(within 5 % of DDP\)"), Quote(ZHANG, rf"the grid below had {F} and"))),
    Figure("ssp, no straggler", grid("none", "ssp"), (
        *in_table("SSPStrategy", rf"without stragglers \({F} in the grid"),
        Quote(INDEX, rf"and\s+`ssp` at {F}, a rerun"), Quote(SSP, rf"about DDP's time: {F} in the grid"),
        Quote(SSP, rf"against DDP's\): without stragglers\s+{F};"), Quote(ZHANG, rf"the grid below had \S+ and {F}:"),
        Quote(ZHANG, rf"{F}\s+without stragglers\. Under transient"), Quote(ZHANG, rf"reaches 98 % {F} sooner, within"))),
    Figure("balanced, no straggler, rerun", rerun("none", "balanced"), (
        *in_table("BalancedDataParallelStrategy", rf"in the grid, {F} in a rerun"),
        Quote(INDEX, rf"a rerun at {F} and"), Quote(BALANCED, rf"in the grid, {F} in a rerun"),
        Quote(ZHANG, rf"DDP at 98 % \({F}, "))),
    Figure("ssp, no straggler, rerun", rerun("none", "ssp"), (
        *in_table("SSPStrategy", rf"in the grid, {F} in a rerun"),
        Quote(INDEX, rf"a rerun at \S+ and {F};"), Quote(SSP, rf"in the grid, {F} in a rerun"),
        Quote(ZHANG, rf"DDP at 98 % \(\S+, {F}\)"))),
    Figure("balanced, compute", grid("compute_persistent", "balanced"), (
        Quote(INDEX, rf"\(compute {F} against"), Quote(BALANCED, rf"\*\*{F} sooner than DDP\*\*"),
        Quote(ZHANG, rf"DDP measured \(compute {F} against"), Quote(ZHANG, rf"compute falls just short \({F}\)"))),
    Figure("ssp, compute", grid("compute_persistent", "ssp"), (
        Quote(INDEX, rf"\(compute \S+ against {F},"), Quote(SSP, rf"\*\*{F} sooner than DDP\*\*"),
        Quote(SSP, rf"in its DataLoader, {F}, \S+ and"), Quote(ZHANG, rf"LeNet-5 to 98 %:\*\* {F} \(compute\)"),
        Quote(ZHANG, rf"reaches 98 % {F} sooner \(it needs"))),
    Figure("balanced, after the step", grid("after_step_persistent", "balanced"), (
        Quote(INDEX, rf"after-step callback\s+{F} against"), Quote(BALANCED, rf"\*\*{F}\*\* slow after its step"),
        Quote(ZHANG, rf"after_step {F} against"))),
    Figure("ssp, after the step", grid("after_step_persistent", "ssp"), (
        Quote(INDEX, rf"after-step callback\s+\S+ against {F},"), Quote(SSP, rf"\*\*{F}\*\* when it\s+is slow after"),
        Quote(SSP, rf"in its DataLoader, \S+, {F} and"), Quote(ZHANG, rf"98 %:\*\* \S+ \(compute\), {F} \(after_step\)"))),
    Figure("balanced, data", grid("data_persistent", "balanced"), (
        Quote(INDEX, rf"data loading {F} against"), Quote(BALANCED, rf"\*\*{F}\*\* slow in its data loader"),
        Quote(ZHANG, rf"data {F} against"))),
    Figure("ssp, data", grid("data_persistent", "ssp"), (
        Quote(INDEX, rf"data loading \S+ against {F},"), Quote(SSP, rf"\*\*{F}\*\* when its data loader"),
        Quote(SSP, rf"\S+, \S+ and\s+{F}; a CPU-bound"),
        Quote(ZHANG, rf"98 %:\*\* \S+ \(compute\), \S+ \(after_step\), {F}\s+\(data\)"))),
    Figure("balanced, contention", grid("contention_persistent", "balanced"), (
        Quote(INDEX, rf"CPU contention {F} against"), Quote(BALANCED, rf"\*\*{F}\*\* under real CPU\s+contention"),
        Quote(ZHANG, rf"contention {F} against"))),
    Figure("ssp, contention", grid("contention_persistent", "ssp"), (
        Quote(INDEX, rf"CPU contention \S+ against {F}\)"), Quote(SSP, rf"\*\*{F}\*\* under real CPU contention"),
        Quote(SSP, rf"sharing its core, {F};"), Quote(ZHANG, rf"{F} under contention \(DDP"))),
    Figure("balanced, compute, rerun", rerun("compute_persistent", "balanced"), (
        Quote(INDEX, rf"ahead on compute \(\S+ against {F}\)"),)),
    Figure("ssp, compute, rerun", rerun("compute_persistent", "ssp"), (Quote(INDEX, rf"ahead on compute \({F} against"),)),
    Figure("balanced, data, rerun", rerun("data_persistent", "balanced"), (Quote(INDEX, rf"on data\s+\({F} against"),)),
    Figure("ssp, data, rerun", rerun("data_persistent", "ssp"), (Quote(INDEX, rf"on data\s+\(\S+ against {F}\)"),)),
    Figure("grid, transient", grid(TRANSIENT, "balanced", "ssp", "ssp_async"), (
        Quote(INDEX, rf"by much \({F};"), Quote(REPORT, rf"ssp_async ran at {F} DDP's time"))),
    Figure("balanced, transient", grid(TRANSIENT, "balanced"), (
        Quote(BALANCED, rf"Transient stragglers it cannot predict \({F}\)"), Quote(ZHANG, rf"nothing to\s+balance \({F},"))),
    Figure("ssp, transient", grid(TRANSIENT, "ssp"), (
        Quote(SSP, rf"only transient \({F}\)"), Quote(SSP, rf"per step\) {F}:"),
        Quote(ZHANG, rf"Under transient stragglers {F},"))),
    Figure("ssp_async, compute spells", grid("compute_transient", "ssp_async"), (
        Quote(INDEX, rf"compute spells, {F}\)"),)),
    Figure("ssp_async, compute and callback spells", grid("(compute|after_step)_transient", "ssp_async"), (
        Quote(REPORT, rf"\(ssp_async {F} under compute"), Quote(SSP, rf"`staleness=inf` does {F} there"),
        Quote(ZHANG, rf"ssp_async \(no bound\) gets {F} there"))),
    Figure("grid, no straggler", grid("none", "balanced", "ssp", "ssp_async"), (
        Quote(REPORT, rf"ssp_async ran at {F} of its time"),)),
    Figure("balanced, 97 %, rerun", Stated(ZHANG, rf"at 97 % the same runs give {F}\s+and"), (
        Quote(BALANCED, rf"in a rerun, {F} at 97 %"),)),
    Figure("ssp, 97 %, rerun", Stated(ZHANG, rf"at 97 % the same runs give \S+\s+and\s+{F}"), (
        Quote(SSP, rf"in a rerun \({F} at 97 %"),)),
    # The delayed all-reduce's slow-link table (docs/strategies/delayed-averaging.md#measured).
    Figure("dga delay 4, 50 ms round trip", line("50 ms", "dga_d4"), (
        *in_table("DelayedAveragingStrategy", rf"to 98 % {F} sooner through a real 50 ms round trip"),
        Quote(INDEX, rf"{F} sooner\s+through a 50 ms round trip"), Quote(ASGD, rf"reached 98 % {F} sooner than DDP through")),
    ),
    Figure("dga delay 4, samples through the long link", over_ddp(LONG, "50 ms", "dga_d4", "samples to target"), (
        Quote(ASGD, rf"but it needed {F}\s+DDP's samples \(DDP's best"), Quote(INDEX, rf"`delay=4`, {F} DDP's samples"),
        Quote(ASGD, rf"but it needed {F} DDP's samples, and every test"))),
    Figure("local SGD, samples through the long link", over_ddp(LONG, "50 ms", "local_h32", "samples to target"), (
        Quote(ASGD, rf"local SGD, which needed {F} DDP's samples"), Quote(LOCAL, rf"{F} DDP's samples every 32 steps in the long link's"))),
    Figure("dga delay 4, its step against DDP's at 50 ms", over_ddp(STEP, "50 ms", "dga_d4", "line", ddp_over=True), (
        Quote(ASGD, rf"Its step was {F} shorter than DDP's"),)),
    Figure("DDP accumulating 2 batches, 50 ms", line("50 ms", "ddp_acc2"), (Quote(ASGD, rf"\(2 batches: {F};"),)),
    Figure("DDP accumulating 2 batches, samples", over_ddp(LONG, "50 ms", "ddp_acc2", "samples to target"), (
        Quote(ASGD, rf"it needs {F} DDP's samples at its best rate"),)),
    Figure("dga delay 4, 200 ms round trip", line("200 ms", "dga_d4"), (
        *in_table("DelayedAveragingStrategy", rf"{F} through 200 ms"), Quote(INDEX, rf"{F} through\s+200 ms"),
        Quote(ASGD, rf"{F}\s+through a 200 ms one"))),
    Figure("dga delay 2, 100 Mbit/s", e2e("dga_d2", "100mbit"), (
        *in_table("DelayedAveragingStrategy", rf"{F} at 100 Mbit/s"), Quote(INDEX, rf"compute \({F} at 100 Mbit/s"),
        Quote(ASGD, rf"`delay=2`, {F} DDP through a 100 Mbit/s link"), Quote(ASGD, rf"little at 100 Mbit/s \({F}\)"),
        Quote(ASGD, rf"against {F} measured"))),
    Figure("dga delay 2, 100 Mbit/s, computed", link("dga_d2", "100mbit"), (Quote(ASGD, rf"overstated DGA: {F} at 100"),)),
    Figure("dga delay 2, 10 Mbit/s", e2e("dga_d2", "10mbit"), (
        Quote(ASGD, rf"{F} through 10 Mbit/s, \S+ under"), Quote(ASGD, rf"lost at 10 Mbit/s \({F}\)"),
        Quote(INDEX, rf"Mbit/s, {F} at 10\)"))),
    Figure("dga delay 2, unshaped", e2e("dga_d2", "unshaped"), (
        *in_table("DelayedAveragingStrategy", rf"{F} unshaped"), Quote(INDEX, rf"took {F} DDP's time \(end"),
        Quote(ASGD, rf"and {F} with nothing slow"), Quote(ASGD, rf"`delay=2` took {F} DDP's time"))),
    Figure("dga delay 2, transient stragglers", e2e("dga_d2", "stragglers"), (
        Quote(INDEX, rf"`delayed_averaging` \(`delay=2`\) {F} \("), Quote(REPORT, rf"strategy=delayed_averaging \(delay=2\) {F}"),
        Quote(ASGD, rf"{F} under transient\s+stragglers"), Quote(ASGD, rf"Transient stragglers: DGA {F}"),
        Quote(ASGD, rf"under transient stragglers it gained {F} here"))),
    Figure("dga delay 2, samples", Cells(ASGD, LINK_SAMPLES, ("dga_d2",), ("x DDP's samples",)), (
        Quote(ASGD, rf"needed\s+\S+,\s+{F} and \S+ DDP's samples"), Quote(ASGD, rf"that sweep's rates gave DGA {F}"))),
    Figure("dga delay 1, samples", Cells(ASGD, LINK_SAMPLES, ("dga_d1",), ("x DDP's samples",)), (
        Quote(ASGD, rf"needed\s+{F},\s+\S+ and \S+ DDP's samples"),)),
    Figure("dga delay 4, samples", Cells(ASGD, LINK_SAMPLES, ("dga_d4",), ("x DDP's samples",)), (
        Quote(ASGD, rf"needed\s+\S+,\s+\S+ and {F} DDP's samples"),)),
    Figure("local SGD, 100 Mbit/s", e2e("local_h32", "100mbit"), (
        *in_table("LocalSGDStrategy", rf"{F} sooner at 100 Mbit/s"), Quote(INDEX, rf"at 100 Mbit/s {F}\s+\(every 32\)"),
        Quote(LOCAL, rf"{F} and \S+ through 100 Mbit/s"), Quote(ASGD, rf"won: {F} and \S+ at\s+100 Mbit/s"))),
    Figure("local SGD every 64, 100 Mbit/s", e2e("local_h64", "100mbit"), (
        Quote(LOCAL, rf"and {F} at 100 Mbit/s \(\["), Quote(LOCAL, rf"\S+ and {F} through 100 Mbit/s"),
        Quote(ASGD, rf"won: \S+ and {F} at\s+100 Mbit/s"))),
    Figure("local SGD, 10 Mbit/s", e2e("local_h64", "10mbit"), (
        *in_table("LocalSGDStrategy", rf"{F} at 10 Mbit/s"), Quote(INDEX, rf"98 % {F} sooner than DDP \(every 64"),
        Quote(LOCAL, rf"shaped links {F} DDP at 10 Mbit/s"), Quote(LOCAL, rf"\S+ and {F} through 10 Mbit/s"),
        Quote(ASGD, rf"\S+ and {F} at 10 Mbit/s; PowerSGD"))),
    Figure("local SGD every 32, 10 Mbit/s", e2e("local_h32", "10mbit"), (
        Quote(LOCAL, rf"{F} and \S+ through 10 Mbit/s"), Quote(ASGD, rf"{F} and \S+ at 10 Mbit/s; PowerSGD"))),
    Figure("local SGD, 50 ms round trip", line("50 ms", "local_h32"), (
        Quote(INDEX, rf"on this small model \({F},"), Quote(ASGD, rf"the delay line {F} and"),
        Quote(LOCAL, rf"through a real long link {F} DDP at a 50 ms round trip"), Quote(LOCAL, rf"98 % {F} and \S+ sooner\s+than DDP through 50 and 200 ms round trips"))),
    Figure("local SGD, 200 ms round trip", line("200 ms", "local_h32"), (
        *in_table("LocalSGDStrategy", rf"{F} sooner through a real 200 ms round trip"), Quote(INDEX, rf"on this small model \(\S+ {F}\)"),
        Quote(ASGD, rf"the delay line \S+ and {F};"), Quote(LOCAL, rf"and {F} at 200 ms \("),
        Quote(LOCAL, rf"98 % \S+ and {F} sooner\s+than DDP through 50 and 200 ms round trips"))),
    Figure("local SGD, transient stragglers", e2e("local_h32", "stragglers"), (
        Quote(INDEX, rf"reached 98 % {F} sooner and"), Quote(REPORT, rf"reached 98 % {F} sooner than DDP and"),
        Quote(LOCAL, rf"{F} and \S+\s+under transient stragglers"), Quote(ASGD, rf"local SGD {F} and \S+ \(the ranks meet"),
        Quote(ASGD, rf"under transient stragglers {F} and"))),
    Figure("local SGD every 64, transient stragglers", e2e("local_h64", "stragglers"), (
        Quote(LOCAL, rf"\S+ and {F}\s+under transient stragglers"), Quote(ASGD, rf"local SGD \S+ and {F} \(the ranks meet"),
        Quote(ASGD, rf"under transient stragglers \S+ and\s+{F}"))),
    Figure("local SGD, unshaped", e2e("local_h32", "unshaped"), (
        Quote(LOCAL, rf"and {F} and \S+ unshaped"), Quote(ASGD, rf"local SGD {F} and \S+ \(its"))),
    Figure("local SGD every 64, unshaped", e2e("local_h64", "unshaped"), (
        Quote(LOCAL, rf"and \S+ and {F} unshaped"), Quote(ASGD, rf"local SGD \S+ and {F} \(its"))),
    Figure("local SGD, shaped links", e2e("local_h32|local_h64", "10mbit", "100mbit"),
           (Quote(ASGD, rf"through shaped links {F}, under"),)),
    Figure("PowerSGD, 10 Mbit/s", e2e("powersgd_r2", "10mbit"), (
        Quote(INDEX, rf"\({F} at 10 Mbit/s\)"), Quote(ASGD, rf"all-reduce \S+ and {F}\."))),
    Figure("PowerSGD, 100 Mbit/s", e2e("powersgd_r2", "100mbit"), (Quote(ASGD, rf"all-reduce {F} and"),)),
    # The hybrid page's whole-brain memory table (benchmarks/whole_brain_memory.py): the 2-stage pipeline's largest peak.
    Figure("hybrid, whole-brain memory against DDP", Cells(HYBRID, WHOLE_BRAIN, ("pipe2_1f1b",), ("vs DDP",)), (
        *in_table("HybridParallelStrategy", rf"its largest rank peaks at {F} a DDP rank's memory"),
        Quote(HYBRID, rf"the 2-stage pipeline's largest rank\s+peaks at {F} a DDP rank's"),
        Quote(INDEX, rf"largest rank\s+peaks at {F} a DDP rank's"), Quote(ADNI, rf"largest rank\s+peaks at {F} a DDP rank's"),
        Quote(FSDP, rf"pipeline's largest rank\s+\({F}\)"))),
    # ... and fully sharded data parallelism's rows beside it.
    Figure("fsdp, whole-brain memory against DDP", Cells(HYBRID, WHOLE_BRAIN, ("fsdp",), ("vs DDP",)), (
        Quote(FSDP, rf"rank peaks at {F} a DDP rank's memory"),)),
    Figure("fsdp checkpointed, whole-brain memory", Cells(HYBRID, WHOLE_BRAIN, ("fsdp_ckpt",), ("vs DDP",)), (
        Quote(FSDP, rf"{F} with activation\s+checkpointing"),)),
    Figure("fsdp checkpointed, a batch of one", Cells(HYBRID, WHOLE_BRAIN, ("fsdp_ckpt_accum",), ("vs DDP",)), (
        Quote(FSDP, rf"and {F} with a batch of one"), *in_table("FullyShardedStrategy", rf"a rank peaks at {F} a DDP rank's"),
        Quote(INDEX, rf"FSDP needs less a rank \({F} a DDP rank's"))),
    # The hybrid page's table at its defaults against DDP, balanced and FSDP, 3 runs a cell (docs/strategies/hybrid.md).
    Figure("hybrid at its defaults, ranks of two speeds", hybrid(TWO_SPEEDS, "hybrid"), (
        *in_table("HybridParallelStrategy", rf"on CPU ranks of different speeds {F} DDP"),
        Quote(INDEX, rf"two speeds it beat DDP {F}"), Quote(HYBRID, rf"it beat DDP {F} and FSDP"),
        Quote(BENCH, rf"ranks of two speeds \({F} DDP"))),
    Figure("hybrid at its defaults against FSDP, ranks of two speeds", Cells(HYBRID, HYBRID_TABLE, (TWO_SPEEDS, "hybrid"),
                                                                              ("vs FSDP",)), (
        *in_table("HybridParallelStrategy", rf"DDP and {F} FSDP"), Quote(INDEX, rf"and FSDP {F}"),
        Quote(HYBRID, rf"and FSDP {F} \(speeds"), Quote(BENCH, rf"DDP, {F}\s+FSDP\)"))),
    Figure("hybrid at its defaults, 2 equal ranks", hybrid("2 equal ranks", "hybrid"), (
        *in_table("HybridParallelStrategy", rf"on 2 equal ranks {F} DDP"), Quote(INDEX, rf"\({F} DDP, `balanced`"),
        Quote(HYBRID, rf"on 2 equal ranks it ran at {F} DDP"), Quote(BENCH, rf"2 equal ranks it runs at {F}"))),
    Figure("balanced, 2 equal ranks", hybrid("2 equal ranks", "balanced"), (
        *in_table("HybridParallelStrategy", rf"\(balanced: {F}\)"), Quote(INDEX, rf"`balanced` {F}\)"),
        Quote(HYBRID, rf"\(balanced data parallelism {F}\)"), Quote(BENCH, rf"balanced data parallelism {F}\)"))),
    Figure("hybrid at its defaults, real contention", hybrid("real contention on rank 1", "hybrid"), (
        Quote(HYBRID, rf"and DDP {F} under\s+real contention"),)),
    # ... and the sweep of micro-batches and placements the defaults were chosen from (one run a cell).
    Figure("hybrid sweep, 4 ranks of two speeds", sweep(SHARES, "hybrid_2x2_m2_timed"), (
        Quote(HYBRID, rf"\*\*\S+ \(4 stages, M=4\) and {F} \(2 x 2, M=2\)\*\*"),)),
    Figure("balanced sweep, 4 ranks of two speeds", sweep(SHARES, "balanced"), (
        Quote(HYBRID, rf"balanced data parallelism reaches {F} DDP"),)),
    Figure("hybrid sweep placed on measured times, speeds [1, 2]", sweep(r"speeds \[1, 2\]", "hybrid_m2_timed"), (
        Quote(HYBRID, rf"on speeds \[1, 2\] {F} DDP at M=2"), Quote(HYBRID, rf"\({F} on \[1, 2\];"))),
    Figure("balanced sweep, 2 ranks", sweep(TWO_RANKS, "balanced"), (
        Quote(HYBRID, rf"of two speeds or contended \({F}\)"),)),
    # The hybrid page's slow-link table (slow_link.py --pipeline): the pipeline between hosts.
    Figure("hybrid, 1 Gbit/s link", Cells(HYBRID, HYBRID_LINK, ("1 Gbit/s", "hybrid"), ("vs DDP",)), (
        *in_table("HybridParallelStrategy", rf"through a 1 Gbit/s link as between hosts {F} DDP"),
        Quote(INDEX, rf"beat DDP {F}\s+at 1 Gbit/s"), Quote(HYBRID, rf"the fastest: {F} DDP at 1 Gbit/s"),
        Quote(BENCH, rf"{F} DDP at 1 Gbit/s"))),
    Figure("hybrid, 100 Mbit/s link", Cells(HYBRID, HYBRID_LINK, ("100 Mbit/s", "hybrid"), ("vs DDP",)), (
        Quote(HYBRID, rf"DDP at 1 Gbit/s, {F} at 100 Mbit/s"), Quote(INDEX, rf"at 1 Gbit/s and {F} at 100 Mbit/s"))),
    Figure("hybrid against FSDP, 100 Mbit/s link", Cells(HYBRID, HYBRID_LINK, ("100 Mbit/s", "hybrid"), ("vs FSDP",)), (
        Quote(HYBRID, rf"and {F} FSDP at 100 Mbit/s"),)),
    # Placement (benchmarks/README.md, hybrid_placement.py): GABRA against the uniform split and balance by time.
    Figure("GABRA over uniform, small input", Cells(BENCH, PLACEMENT, (r"base 32, 32\^3", "gabra"), ("vs uniform",)), (
        Quote(ADNI, rf"trains {F} faster than the uniform placement \(small input\)"),)),
    Figure("GABRA over uniform", Cells(BENCH, PLACEMENT, (".*", "gabra"), ("vs uniform",)), (
        Quote(HYBRID, rf"\*\*{F} faster than a uniform split\*\*"),
        Quote(HYBRID, rf"trains {F} faster than the uniform\s+placement"))),
    Figure("GABRA over balance by time", Quotient(
        Cells(BENCH, PLACEMENT, (".*", "gabra"), ("samples/s",)),
        Cells(BENCH, PLACEMENT, (".*", r"time \(balance_by_time\)"), ("samples/s",))), (
        Quote(HYBRID, rf"{F} faster than\s+torchgpipe's balance by time"),)),
    # Paper 001's recipe: BODP biased by ability against the even split.
    Figure("BODP, abilities [1, 2]", Cells(MODNN, LATENCY, (r"BODP, abilities \[1, 2\]",), ("vs even split",)), (
        Quote(BENCH, rf"150 ms \({F} the\s+even split\)"),)),
    Figure("BODP, probed abilities", Cells(MODNN, LATENCY, ("BODP, abilities measured by the probe",), ("vs even split",)), (
        Quote(BENCH, rf"148 ms \({F}\)"),)),
    # Paper 003's own figure, as the recipe's table gives it (ResAttNet-18, the model the recipe trains).
    Figure("paper 003, AD vs CN", Cells(ADNI, "| task | lr", ("AD vs CN",), ("paper 003 (accuracy)",), "cell"), (
        Quote(ADNI, r"Paper 003 reports (\d\.\d+-\d\.\d+) on AD vs CN"),)),
    # Figures no table holds, each stated in one place; other pages point to it or say the same.
    Figure("the suite's time, minutes", Stated(README, r"The suite takes about (\d+) minutes on 2 cores"), (
        Quote("docs/getting-started.md", r"About (\d+) minutes on 2 cores", optional=True),)),
    Figure("the suite's time, seconds", Stated(README, r"on 2 cores \((\d+) s on \d{4}-\d\d-\d\d"), (
        Quote("docs/getting-started.md", r"on 2 cores \((\d+) s on \d{4}-\d\d-\d\d", optional=True),)),
    Figure("the suite's time, date", Stated(README, r"on 2 cores \(\d+ s on (\d{4}-\d\d-\d\d)"), (
        Quote("docs/getting-started.md", r"on 2 cores \(\d+ s on (\d{4}-\d\d-\d\d)", optional=True),)),
    Figure("experiment=smoke's time", Stated("configs/experiment/smoke.yaml", r"# A ([\w-]+) end-to-end check"), (
        Quote("docs/cli.md", r"experiment=smoke +# an? ([\w-]+) check"),
        Quote("docs/configs.md", r"A ([\w-]+) end-to-end check"))),
]

#: Ratios on the scanned pages that quote no table row: (page, figure, what it is).
NOT_QUOTES = [
    (INDEX, "3.4x", "a sample of the straggler report's line: the factor it measured in that run"),
    (INDEX, "3.2-4.8x", "what the straggler report measured in its tests (tests/test_straggler_report.py), not a table"),
]


def regions() -> dict[str, list[tuple[int, int]]]:
    """The stretches of the quoting pages whose every ratio must be a registered quote: (start, end) offsets."""
    def whole(page: str) -> tuple[int, int]:
        return 0, len(read(page))

    def paragraph(page: str, start: str) -> tuple[int, int]:
        text = read(page)
        begin = text.index(start)
        end = text.find("\n\n", begin)
        return begin, end if end >= 0 else len(text)

    def strategy_rows(page: str) -> list[tuple[int, int]]:
        return [(m.start(), m.end()) for m in re.finditer(r"^\| (\[`|Lightning).*$", read(page), re.MULTILINE)]

    found = {README: strategy_rows(README), SNIPPET: [whole(SNIPPET)], INDEX: [whole(INDEX)], RECIPES: [whole(RECIPES)],
             BENCH: [paragraph(BENCH, "At its defaults (2026-11-29, 3 runs a cell)"),
                     paragraph(BENCH, "VGG-16 (random weights), one image per batch")]}
    for page in sorted((ROOT / "docs" / "strategies").glob("*.md")):
        name = str(page.relative_to(ROOT))
        if name != INDEX:
            found[name] = [paragraph(name, "**Pick it when**")]
    return found


def disagreements(figure: Figure) -> list[str]:
    """Every place that quotes ``figure`` and says something else (or no longer says it)."""
    expected, problems = figure.source.figure(), []
    for quote in figure.quotes:
        text = read(quote.page)
        matches = list(re.finditer(quote.pattern, text))
        if not matches and not quote.optional:
            problems.append(f"{quote.page} no longer quotes {figure.name!r} as {quote.pattern!r}: say {expected} there "
                            "(the figure of its source), or update the pattern in FIGURES")
        for m in matches:
            if normal(m.group(1)) != normal(expected):
                problems.append(f"{quote.page}:{line_of(text, m.start(1))} says {m.group(1)} for {figure.name!r}; "
                                f"its source says {expected} ({figure.source})")
    return problems


def unregistered() -> list[str]:
    covered: dict[str, list[tuple[int, int]]] = {}
    for figure in FIGURES:
        for quote in figure.quotes:
            covered.setdefault(quote.page, []).extend(m.span(1) for m in re.finditer(quote.pattern, read(quote.page)))
    declared = {(page, figure) for page, figure, _ in NOT_QUOTES}
    missing = []
    for page, stretches in regions().items():
        text = read(page)
        for begin, end in stretches:
            for m in RATIO.finditer(text, begin, end):
                if (page, m.group(0)) in declared:
                    continue
                if not any(a <= m.start() and m.end() <= b for a, b in covered.get(page, [])):
                    missing.append(f"{page}:{line_of(text, m.start())}: {m.group(0)}")
    return missing


@pytest.fixture(autouse=True)
def _fresh_pages():
    read.cache_clear()
    yield
    read.cache_clear()


@pytest.mark.parametrize("figure", FIGURES, ids=[f.name for f in FIGURES])
def test_every_place_that_quotes_a_figure_says_its_source_s_figure(figure):
    problems = disagreements(figure)
    assert not problems, "\n".join(problems)


def test_every_ratio_on_a_quoting_page_is_a_registered_quote():
    missing = unregistered()
    assert not missing, ("ratios on pages that quote the measurements, tied to no table row (add each to FIGURES "
                         f"with the row it comes from, or say what else it is in NOT_QUOTES): {missing}")
    assert sum(len(s) for s in regions().values()) > 10


def test_each_registered_figure_has_one_name_and_each_declared_ratio_is_on_its_page():
    names = [f.name for f in FIGURES]
    assert len(names) == len(set(names))
    for page, figure, what in NOT_QUOTES:
        assert figure in read(page), f"{page} no longer shows {figure} ({what}): remove it from NOT_QUOTES"


def test_the_suite_s_time_in_minutes_is_its_seconds():
    minutes, seconds = (int(f.source.figure()) for f in FIGURES if f.name.startswith("the suite's time, ")
                        and not f.name.endswith("date"))
    assert minutes == round(seconds / 60), f"README.md: about {minutes} minutes, but {seconds} s is {seconds / 60:.1f}"


@pytest.mark.skipif(not PAPERS.is_dir(), reason="the papers' text (../shared/papers) is not here")
def test_paper_003_s_figure_is_its_table_3():
    """The recipe's 'paper 003 (accuracy)' for AD vs CN: Table 3's 3D-ResAttNet18 AD vs NC column, 1-8 GPUs."""
    (text,) = [p.read_text() for p in PAPERS.glob("003_*.txt")]
    table3 = text[text.index("TABLE 3"):]
    rows = re.findall(r"^\| ([1-8]) +\|(.*)$", table3[:table3.index("TABLE 4")], re.MULTILINE)
    accuracies = [float(cells.split("|")[2]) for _, cells in rows]
    assert len(accuracies) == 8
    (figure,) = [f for f in FIGURES if f.name == "paper 003, AD vs CN"]
    assert figure.source.figure() == f"{min(accuracies):.2f}-{max(accuracies):.2f}"


def test_a_page_that_disagrees_with_its_source_fails(monkeypatch):
    """The checks above catch an edited page: a changed figure, a dropped quote, an unregistered ratio."""
    original = read(README)
    (balanced,) = [f for f in FIGURES if f.name == "balanced, persistent straggler"]
    assert not disagreements(balanced)

    def pages_with(readme: str):
        def fake(page: str) -> str:
            return readme if page == README else (ROOT / page).read_text()
        return fake

    edited = original.replace("on MNIST 1.55-2.26x sooner", "on MNIST 1.48-2.26x sooner")
    monkeypatch.setattr(f"{__name__}.read", pages_with(edited))
    assert any("README.md:" in p and "says 1.48-2.26x" in p for p in disagreements(balanced))
    monkeypatch.setattr(f"{__name__}.read", pages_with(original.replace("on MNIST 1.55-2.26x sooner", "on MNIST much sooner")))
    assert any("README.md no longer quotes" in p for p in disagreements(balanced))
    monkeypatch.setattr(f"{__name__}.read", pages_with(original.replace("| the baseline |", "| the baseline (1.00x) |")))
    assert any(m.startswith("README.md:") and m.endswith(": 1.00x") for m in unregistered())
