# Generated from lightning_hybrid/cli/command.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""The ``lightning-hybrid`` command's entry point: a subcommand (``data``, ``explain``, ``plan``), or training
through Hydra's command line."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from lightning_hybrid.lightning.cli.app import train
from lightning_hybrid.lightning.cli.data import data_command
from lightning_hybrid.lightning.cli.plan import plan_command


# The job's name (the run's log file cli.log, "cli is powered by Hydra" in --help) is configs/hydra/default.yaml's.
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
