# Generated from lightning_hybrid/cli/__init__.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""The `lightning-hybrid` command: a Hydra app that composes model x data x strategy x trainer.

    lightning-hybrid                                   # LeNet-5 on MNIST, one process
    lightning-hybrid strategy=ddp trainer.devices=2    # two processes, synchronous DDP
    lightning-hybrid -m optimizer.lr=0.01,0.05,0.1     # a sweep, one run folder per job
    lightning-hybrid --help                            # every config group and option
    lightning-hybrid data|explain|plan ...             # subcommands, no training

Here: the console entry point :func:`main` (:mod:`lightning_hybrid.lightning.cli.command`: a subcommand, or
Hydra's command line around :func:`lightning_hybrid.lightning.cli.app.train`; where only ``lightning`` is
installed, the ``lightning`` flavour's). One module per job: ``app`` (the training app), ``data``
(``lightning-hybrid data ...``), ``plan`` (``lightning-hybrid plan``), ``relaunch`` (child ranks under
Hydra sweeps), ``slurm`` (``hydra/launcher=slurm``: what a job asks SLURM for, submitit tasks as
ranks); ``explain`` is :mod:`lightning_hybrid.explain`. ``python -m lightning_hybrid.lightning.cli``
runs :func:`main` too.

The two names are imported on first use (PEP 562), so that the command's plain modules (``checks``,
``resume``, ``sweep_summary``, ...) import no Lightning and are one module under both Lightning namespaces.
"""

from typing import TYPE_CHECKING

from lightning_hybrid.lightning import namespace
from lightning_hybrid.lazy_exports import lazy_exports

if TYPE_CHECKING:  # the names for type checkers; at run time, __getattr__ below imports them
    from lightning_hybrid.lightning.cli.command import SUBCOMMANDS, main

#: Each name this package exports, and the module that defines it.
LAZY = {"SUBCOMMANDS": "lightning_hybrid.lightning.cli.command", "main": "lightning_hybrid.lightning.cli.command"}

__all__ = sorted(LAZY)

# Where only `lightning` is installed, the command is the lightning flavour's (lightning_hybrid.lightning.cli).
_ONLY_LIGHTNING = namespace.BASE == "lightning" and not __name__.startswith(namespace.MIRROR)
_FLAVOUR = namespace.lightning_name if _ONLY_LIGHTNING else str
__getattr__, __dir__ = lazy_exports(globals(), LAZY, _FLAVOUR)
