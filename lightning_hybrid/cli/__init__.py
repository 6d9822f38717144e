"""The `lightning-hybrid` command: a Hydra app that composes model x data x strategy x trainer.

    lightning-hybrid                                   # LeNet-5 on MNIST, one process
    lightning-hybrid strategy=ddp trainer.devices=2    # two processes, synchronous DDP
    lightning-hybrid -m optimizer.lr=0.01,0.05,0.1     # a sweep, one run folder per job
    lightning-hybrid --help                            # every config group and option
    lightning-hybrid data|explain|plan ...             # subcommands, no training

Here: the console entry point :func:`main`, which runs a subcommand or Hydra's command line around
:func:`lightning_hybrid.cli.app.train`. One module per job: ``app`` (the training app), ``data``
(``lightning-hybrid data ...``), ``plan`` (``lightning-hybrid plan``), ``relaunch`` (child ranks under
Hydra sweeps), ``slurm`` (``hydra/launcher=slurm``: what a job asks SLURM for, submitit tasks as
ranks); ``explain`` is :mod:`lightning_hybrid.explain`. ``python -m lightning_hybrid.cli``
runs :func:`main` too.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from lightning_hybrid.cli.app import train
from lightning_hybrid.cli.data import data_command
from lightning_hybrid.cli.plan import plan_command


# Defined in this module, not in app.py: Hydra names the job after the module of the decorated
# function (the run's log file cli.log, "cli is powered by Hydra" in --help).
@hydra.main(version_base="1.3", config_path="pkg://lightning_hybrid.configs", config_name="train")
def _hydra_train(cfg: DictConfig) -> float | None:
    metrics = train(cfg)
    # A sweeper (e.g. Optuna) optimizes the returned value: balanced accuracy where it is reported (ADNI).
    return next((metrics[k] for k in ("test/bacc", "test/acc", "val/bacc", "val/acc") if k in metrics), None)


def explain_command(argv: list[str]) -> None:
    from lightning_hybrid.explain import explain_command as run

    run(argv)


#: ``lightning-hybrid <name> ...`` runs these instead of training.
SUBCOMMANDS = {"data": data_command, "explain": explain_command, "plan": plan_command}


def main() -> None:
    """Console entry point of ``lightning-hybrid``: a subcommand, or training (Hydra overrides)."""
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        SUBCOMMANDS[sys.argv[1]](sys.argv[2:])
        return
    _hydra_train()
