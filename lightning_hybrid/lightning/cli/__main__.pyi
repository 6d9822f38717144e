# Generated from lightning_hybrid/cli/__main__.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from lightning_hybrid.lightning.cli import main
