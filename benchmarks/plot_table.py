"""A figure from a markdown table kept in a recipe or benchmarks/README.md: bars of numeric columns.

    python benchmarks/plot_table.py recipes/mao2017_modnn/README.md --table "| contender | latency ms" \
        --columns "latency ms" --out docs/figures/modnn_latency.png --title "VGG-16 latency"

``--table`` is the start of the table's header line (the file may hold many tables); each row is a
group of bars labelled by its first cell, one bar per ``--columns`` column, the cell's first number its
height (``1.26 / 1.79`` draws 1.26; a cell without a number draws nothing). The table stays the
source of the numbers: the figure is redrawn from it.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import textwrap
from pathlib import Path

NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def read_table(markdown: str, header_start: str) -> tuple[list[str], list[list[str]]]:
    """The header cells and rows of the first table whose header line starts with ``header_start``."""
    lines = markdown.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith(header_start)), None)
    if start is None:
        raise ValueError(f"no table whose header starts with {header_start!r}")
    cells = lambda line: [cell.strip() for cell in line.strip().strip("|").split("|")]  # noqa: E731
    header, rows = cells(lines[start]), []
    for line in lines[start + 2:]:
        if not line.strip().startswith("|"):
            break
        rows.append(cells(line))
    return header, rows


def first_number(cell: str) -> float:
    match = NUMBER.search(cell.replace("**", ""))
    return float(match.group().replace(",", "")) if match else math.nan


def grouped_bars(labels: list[str], series: dict[str, list[float]], out: Path, title: str, ylabel: str = "",
                 baseline: float | None = None, values_on_bars: bool = True) -> None:
    """Groups of bars: one group per label, one bar per series (``nan``: no bar, a cross at the bottom).
    ``baseline`` draws a horizontal line (1.0 for speed-ups). Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6.0, (0.35 * len(series) + 0.6) * len(labels) + 2), 4.2))
    for k, (name, ys) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(labels))]
        bars = ax.bar(xs, [y if math.isfinite(y) else 0.0 for y in ys], width, label=name, color=f"C{k}")
        if values_on_bars:
            ax.bar_label(bars, labels=[f"{y:g}" if math.isfinite(y) else "" for y in ys], fontsize=7)
        for x, y in zip(xs, ys):
            if not math.isfinite(y):
                ax.plot(x, 0.0, marker="x", color=f"C{k}", clip_on=False)
    if baseline is not None:
        ax.axhline(baseline, color="black", linewidth=1)
    wrap = max(12, int(90 / len(labels)))  # characters per line: long row labels wrap instead of overlapping
    ax.set_xticks(range(len(labels)), [textwrap.fill(label, wrap) for label in labels], fontsize=8)
    ax.set_ylabel(ylabel)
    missing = any(not math.isfinite(y) for ys in series.values() for y in ys)
    ax.set_title(title + ("; x: no value (never reached)" if missing else ""), fontsize=10)
    if len(series) > 1:
        ax.legend(fontsize=8, ncol=min(4, len(series)))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot(header: list[str], rows: list[list[str]], columns: list[str], out: Path, title: str, ylabel: str) -> None:
    """The table's ``columns`` as bars, one group per row."""
    missing = [c for c in columns if c not in header]
    if missing:
        raise ValueError(f"columns {missing} are not in the table's header {header}")
    series = {c: [first_number(row[header.index(c)]) if header.index(c) < len(row) else math.nan for row in rows]
              for c in columns}
    labels = [re.sub(r"[*`]", "", row[0]) for row in rows]
    grouped_bars(labels, series, out, title, ylabel or (columns[0] if len(columns) == 1 else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path, help="a markdown file holding the table")
    parser.add_argument("--table", required=True, help="the start of the table's header line, e.g. '| contender | latency'")
    parser.add_argument("--columns", nargs="+", required=True, help="the columns drawn as bars")
    parser.add_argument("--out", type=Path, required=True, help="the PNG written")
    parser.add_argument("--title", default="")
    parser.add_argument("--ylabel", default="")
    args = parser.parse_args(argv)
    header, rows = read_table(args.file.read_text(), args.table)
    try:
        plot(header, rows, args.columns, args.out, args.title, args.ylabel)
    except ImportError:
        print("matplotlib is not installed: pip install 'lightning-hybrid[plots]'", file=sys.stderr)
        return 1
    print(f"figure: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
