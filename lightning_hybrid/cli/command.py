"""The ``lightning-hybrid`` command's entry point: a subcommand (``data``, ``explain``, ``plan``), or training
through Hydra's command line."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from lightning_hybrid.cli.app import train
from lightning_hybrid.cli.checks import user_error
from lightning_hybrid.cli.data import data_command
from lightning_hybrid.cli.plan_command import plan_command
from lightning_hybrid.data.adni_settings import FLAT_NAMES


# The job's name (the run's log file cli.log, "cli is powered by Hydra" in --help) is configs/hydra/default.yaml's.
@hydra.main(version_base="1.3", config_path="pkg://lightning_hybrid.configs", config_name="train")
def _hydra_train(cfg: DictConfig) -> float | None:
    try:
        metrics = train(cfg)
    except Exception as error:
        message = user_error(error)
        if message is None:
            raise  # a bug: its traceback
        print(f"error: {message}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    # A sweeper (e.g. Optuna) optimizes the returned value: balanced accuracy where it is reported (ADNI).
    return next((metrics[k] for k in ("test/bacc", "test/acc", "val/bacc", "val/acc") if k in metrics), None)


def explain_command(argv: list[str]) -> None:
    from lightning_hybrid.explain import explain_command as run

    run(argv)


#: data=adni's keys before its settings were grouped, and where they are now; not those other datamodules also
#: have (``root``, ``val_fraction``), nor those that are a group's name now (``split``, ``cache``: see below).
MOVED_DATA_KEYS = {name: new for name, new in FLAT_NAMES.items() if name not in ("root", "val_fraction", "split", "cache")}
#: Groups that were a single value: ``data.split=3`` was the fold, ``data.cache=memory`` where volumes were held.
GROUPS_THAT_WERE_VALUES = {"split": "split.fold", "cache": "cache.where", "augment": "augment.where"}


def moved_overrides(argv: list[str]) -> list[str]:
    """What each override of ``argv`` that names a moved data=adni key should say instead."""
    hints = []
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        name = key.removeprefix("data.")
        if not sep or name == key:
            continue
        new = MOVED_DATA_KEYS.get(name)
        if name in ("augment", "cache") and value.lower() == "null":
            continue  # the whole group off: no augmentation, nothing cached (adni_settings.OFF)
        if new is None and name in GROUPS_THAT_WERE_VALUES and not value.startswith("{"):
            new = GROUPS_THAT_WERE_VALUES[name]
            if name == "augment":
                value = {"false": "null", "true": "device"}.get(value.lower(), value)
        if new is not None:
            hints.append(f"{arg} -> data.{new}={value}")
    return hints


#: ``lightning-hybrid <name> ...`` runs these instead of training.
SUBCOMMANDS = {"data": data_command, "explain": explain_command, "plan": plan_command}


def main() -> None:
    """Console entry point of ``lightning-hybrid``: a subcommand, or training (Hydra overrides)."""
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        SUBCOMMANDS[sys.argv[1]](sys.argv[2:])
        return
    hints = moved_overrides(sys.argv[1:])
    if hints:
        raise SystemExit("data=adni's settings are grouped now (data.source, data.split, data.view, data.augment, "
                         "data.cache; docs/configs.md lists them). Instead of\n  " + "\n  ".join(hints))
    _hydra_train()
