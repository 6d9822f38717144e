# Generated from lightning_hybrid/cli/command.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import sys
import hydra
from omegaconf import DictConfig
from lightning_hybrid.lightning.cli.app import train
from lightning_hybrid.cli.checks import user_error
from lightning_hybrid.lightning.cli.data import data_command
from lightning_hybrid.lightning.cli.plan import plan_command
from lightning_hybrid.data.adni_settings import FLAT_NAMES

@hydra.main(version_base='1.3', config_path='pkg://lightning_hybrid.configs', config_name='train')
def _hydra_train(cfg: DictConfig) -> float | None:
    ...

def explain_command(argv: list[str]) -> None:
    ...
MOVED_DATA_KEYS = ...
GROUPS_THAT_WERE_VALUES = ...

def moved_overrides(argv: list[str]) -> list[str]:
    ...
SUBCOMMANDS = ...

def main() -> None:
    ...
