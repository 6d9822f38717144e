"""What reaching the ``lightning`` flavour costs a process: ``import lightning_hybrid.lightning`` against
``import lightning_hybrid, lightning.pytorch`` (what it cannot do without), each in a fresh interpreter,
alternated, ``--repeats`` times; medians and the difference. ``--before REV`` also measures a commit of this
repository (checked out in a temporary worktree) the same way, side by side; ``--python`` other interpreters
(each needs torch, Lightning and this package's dependencies installed).

A third statement, ``import lightning_hybrid.namespace, lightning.pytorch`` (a plain module of ours, no
Lightning in it), imports the same modules as the first at the call depth of the second: CPython (3.11, 3.12, and
3.13 and 3.14 before the fix of gh-142183, merged in March 2026) allocates its frame stack in chunks and maps and
unmaps a chunk on every call that crosses a chunk's end, so one loop of scipy's (its docstring parsing, imported by torchmetrics) runs
several times slower at some depths than at others. The third row tells that cost, which belongs to the depth of
the import and not to what it imports, from the flavour's own. ``--count-mmap`` also counts the interpreter's
``mmap`` calls (through ``strace``), which show it.

    python benchmarks/import_time.py --repeats 15 --before 9f6369f
    python benchmarks/import_time.py --repeats 11 --python /path/to/python3.13 --count-mmap

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
STATEMENTS = {"without": "import lightning_hybrid, lightning.pytorch", "with": "import lightning_hybrid.lightning",
              "same depth": "import lightning_hybrid.namespace, lightning.pytorch"}


def seconds(statement: str, tree: Path, python: str) -> tuple[float, float]:
    """One fresh interpreter running ``statement`` with ``tree`` first on its path: its wall time (start-up and
    exit included), and the seconds ``-X importtime`` counts in its imports (every module's own time, summed)."""
    start = time.perf_counter()
    done = subprocess.run([python, "-X", "importtime", "-c",
                           f"import sys; sys.path.insert(0, {str(tree)!r}); {statement}"],
                          check=True, capture_output=True, text=True, cwd=tree, env=ENV)
    wall = time.perf_counter() - start
    imports = sum(int(line.split("|")[0].split(":")[1]) for line in done.stderr.splitlines()
                  if line.startswith("import time:") and "self [us]" not in line) / 1e6
    return wall, imports


def mmap_calls(statement: str, tree: Path, python: str) -> int:
    """The ``mmap`` system calls of one interpreter running ``statement`` (``strace -c``)."""
    done = subprocess.run(["strace", "-f", "-c", "-e", "trace=mmap", python, "-c",
                           f"import sys; sys.path.insert(0, {str(tree)!r}); {statement}"],
                          check=True, capture_output=True, text=True, cwd=tree, env=ENV)
    return next(int(line.split()[3]) for line in done.stderr.splitlines() if line.rstrip().endswith(" mmap"))


def measure(tree: Path, repeats: int, python: str) -> dict[str, list[tuple[float, float]]]:
    times: dict[str, list[tuple[float, float]]] = {key: [] for key in STATEMENTS}
    seconds(STATEMENTS["with"], tree, python)  # warm: .pyc files written, the page cache filled
    for _ in range(repeats):
        for key, statement in STATEMENTS.items():
            times[key].append(seconds(statement, tree, python))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--before", default=None, help="a commit to measure beside the working tree")
    parser.add_argument("--python", nargs="+", default=[sys.executable], help="interpreters to measure with")
    parser.add_argument("--count-mmap", action="store_true", help="also count each statement's mmap calls (strace)")
    args = parser.parse_args()
    trees = {"this tree": ROOT}
    with tempfile.TemporaryDirectory() as tmp:
        if args.before:
            subprocess.run(["git", "worktree", "add", "--detach", f"{tmp}/before", args.before], cwd=ROOT, check=True,
                           capture_output=True)
            trees[args.before] = Path(tmp) / "before"
        try:
            results = {(name, python): measure(tree, args.repeats, python) for name, tree in trees.items()
                       for python in args.python}
            mmaps = {(name, python): {key: mmap_calls(statement, tree, python) for key, statement in STATEMENTS.items()}
                     for name, tree in trees.items() for python in args.python} if args.count_mmap else {}
        finally:
            if args.before:
                subprocess.run(["git", "worktree", "remove", "--force", f"{tmp}/before"], cwd=ROOT, capture_output=True)
    print(f"| tree | python | measure | `{STATEMENTS['without']}` s | `{STATEMENTS['with']}` s | difference s (median of "
          f"pairs, range) | `{STATEMENTS['same depth']}` s | difference of the second from it s |")
    print("|---|---|---|---|---|---|---|---|")
    for (name, python), times in results.items():
        version = subprocess.run([python, "-c", "import platform; print(platform.python_version())"], check=True,
                                 capture_output=True, text=True).stdout.strip()
        for index, measure_name in enumerate(("wall (start-up and exit included)", "-X importtime (imports' own time)")):
            without, with_, same_depth = ([t[index] for t in times[key]] for key in STATEMENTS)
            pairs = [w - wo for w, wo in zip(with_, without)]
            depth_pairs = [w - d for w, d in zip(with_, same_depth)]
            print(f"| {name} | {version} | {measure_name} | {statistics.median(without):.3f} | "
                  f"{statistics.median(with_):.3f} | {statistics.median(pairs):+.3f} ({min(pairs):+.3f} to "
                  f"{max(pairs):+.3f}) | {statistics.median(same_depth):.3f} | {statistics.median(depth_pairs):+.3f} "
                  f"({min(depth_pairs):+.3f} to {max(depth_pairs):+.3f}) |")
        if (name, python) in mmaps:
            print(f"| {name} | {version} | mmap calls | " + " | ".join(
                str(mmaps[name, python][key]) for key in ("without", "with")) + f" | | {mmaps[name, python]['same depth']} | |")


if __name__ == "__main__":
    main()
