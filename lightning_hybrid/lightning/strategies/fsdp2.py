# Generated from lightning_hybrid/strategies/fsdp2.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""``lightning_hybrid.strategies.fsdp2`` against ``lightning``: ``lightning_hybrid/strategies/fsdp2.py`` with Lightning's names replaced, run
here when imported (:func:`lightning_hybrid.namespace.run_translated`); its interface for type checkers and
IDEs is the ``.pyi`` file beside this one."""

from lightning_hybrid.namespace import run_translated

run_translated(globals(), "strategies/fsdp2.py")
