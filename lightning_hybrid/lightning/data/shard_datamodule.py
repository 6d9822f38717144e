# Generated from lightning_hybrid/data/shard_datamodule.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""``lightning_hybrid.data.shard_datamodule`` against ``lightning``: ``lightning_hybrid/data/shard_datamodule.py`` with Lightning's names replaced, run
here when imported (:func:`lightning_hybrid.namespace.run_translated`); its interface for type checkers and
IDEs is the ``.pyi`` file beside this one."""

from lightning_hybrid.namespace import run_translated

run_translated(globals(), "data/shard_datamodule.py")
