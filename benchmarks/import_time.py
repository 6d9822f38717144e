"""What reaching the ``lightning`` flavour costs a process: ``import lightning_hybrid.lightning`` against
``import lightning_hybrid, lightning.pytorch`` (what it cannot do without), each in a fresh interpreter,
alternated, ``--repeats`` times; medians and the difference. ``--before REV`` also measures a commit of this
repository (checked out in a temporary worktree) the same way, side by side.

    python benchmarks/import_time.py --repeats 15 --before 9f6369f

Run it on a quiet machine: the difference is tenths of a second beside seconds of torch and Lightning.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: As a user's machine runs: ``.pyc`` files written and read (a sandbox may set PYTHONDONTWRITEBYTECODE, which makes
#: every process compile the package's modules again: 0.27 s here).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
STATEMENTS = {"without": "import lightning_hybrid, lightning.pytorch", "with": "import lightning_hybrid.lightning"}


def seconds(statement: str, tree: Path) -> tuple[float, float]:
    """One fresh interpreter running ``statement`` with ``tree`` first on its path: its wall time (start-up and
    exit included), and the seconds ``-X importtime`` counts in its imports (every module's own time, summed)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-X", "importtime", "-c",
                           f"import sys; sys.path.insert(0, {str(tree)!r}); {statement}"],
                          check=True, capture_output=True, text=True, cwd=tree, env=ENV)
    wall = time.perf_counter() - start
    imports = sum(int(line.split("|")[0].split(":")[1]) for line in done.stderr.splitlines()
                  if line.startswith("import time:") and "self [us]" not in line) / 1e6
    return wall, imports


def measure(tree: Path, repeats: int) -> dict[str, list[tuple[float, float]]]:
    times: dict[str, list[tuple[float, float]]] = {key: [] for key in STATEMENTS}
    seconds(STATEMENTS["with"], tree)  # warm: .pyc files written, the page cache filled
    for _ in range(repeats):
        for key, statement in STATEMENTS.items():
            times[key].append(seconds(statement, tree))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--before", default=None, help="a commit to measure beside the working tree")
    args = parser.parse_args()
    trees = {"this tree": ROOT}
    with tempfile.TemporaryDirectory() as tmp:
        if args.before:
            subprocess.run(["git", "worktree", "add", "--detach", f"{tmp}/before", args.before], cwd=ROOT, check=True,
                           capture_output=True)
            trees[args.before] = Path(tmp) / "before"
        try:
            results = {name: measure(tree, args.repeats) for name, tree in trees.items()}
        finally:
            if args.before:
                subprocess.run(["git", "worktree", "remove", "--force", f"{tmp}/before"], cwd=ROOT, capture_output=True)
    print(f"| tree | measure | `{STATEMENTS['without']}` s | `{STATEMENTS['with']}` s | difference s (median of pairs, range) |")
    print("|---|---|---|---|---|")
    for name, times in results.items():
        for index, measure_name in enumerate(("wall (start-up and exit included)", "-X importtime (imports' own time)")):
            without = [t[index] for t in times["without"]]
            with_ = [t[index] for t in times["with"]]
            pairs = [w - wo for w, wo in zip(with_, without)]
            print(f"| {name} | {measure_name} | {statistics.median(without):.3f} | {statistics.median(with_):.3f} | "
                  f"{statistics.median(pairs):+.3f} ({min(pairs):+.3f} to {max(pairs):+.3f}) |")


if __name__ == "__main__":
    main()
