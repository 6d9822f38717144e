"""Writes ``lightning_hybrid/lightning/``, the suite's ``lightning`` flavour, from the package's source
(:mod:`lightning_hybrid.namespace`). Run it after editing a module that imports Lightning, and commit
what it writes; ``tests/test_namespace.py`` fails while a file is stale.

    python tools/generate_lightning_namespace.py
"""

from lightning_hybrid.namespace import write_mirror

if __name__ == "__main__":
    written = write_mirror()
    for path in written:
        print(f"wrote lightning_hybrid/{path}")
    print(f"{len(written)} files changed" if written else "lightning_hybrid/lightning/ is current")
