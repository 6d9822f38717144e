# Generated from lightning_hybrid/cli/__main__.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""``python -m lightning_hybrid.lightning.cli ...``: the same as the ``lightning-hybrid`` command."""

from lightning_hybrid.lightning.cli import main

if __name__ == "__main__":
    main()
