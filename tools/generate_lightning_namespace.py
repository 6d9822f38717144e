"""Writes ``lightning_hybrid/lightning/``, the suite's ``lightning`` flavour, from the package's source
(:mod:`lightning_hybrid.namespace`). Run it after editing a module that imports Lightning, and commit
what it writes; ``tests/test_namespace.py`` fails while a file is stale.

    python tools/generate_lightning_namespace.py           # rewrite what is stale
    python3 tools/generate_lightning_namespace.py --check  # only say what is stale (exit 1); CI and pre-commit

It needs no installed package: ``namespace.py`` is plain Python (the standard library), loaded by its path,
so the check runs in a second on a fresh checkout, before anything is installed.
"""

import argparse
import importlib.util
import sys
from pathlib import Path

NAMESPACE = Path(__file__).resolve().parents[1] / "lightning_hybrid" / "namespace.py"


def load_namespace():
    spec = importlib.util.spec_from_file_location("lightning_hybrid_namespace", NAMESPACE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming the stale files")
    args = parser.parse_args()
    namespace = load_namespace()
    if args.check:
        stale = namespace.stale_mirror_files()
        for path in stale:
            print(f"stale: lightning_hybrid/{path}")
        print(f"{len(stale)} stale files: run `python tools/generate_lightning_namespace.py` and commit them" if stale
              else "lightning_hybrid/lightning/ is current")
        sys.exit(1 if stale else 0)
    written = namespace.write_mirror()
    for path in written:
        print(f"wrote lightning_hybrid/{path}")
    print(f"{len(written)} files changed" if written else "lightning_hybrid/lightning/ is current")
