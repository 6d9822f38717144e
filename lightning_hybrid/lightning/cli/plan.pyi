# Generated from lightning_hybrid/cli/plan.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
from pathlib import Path
import torch
import yaml
from hydra import compose, initialize_config_module
from lightning_hybrid.lightning.cli.app import build
from lightning_hybrid.devices import devices_from_config, devices_in_flops, probe_speed
from lightning_hybrid.placement.cost import profile_blocks
from lightning_hybrid.placement.plan import METHODS, compare, format_comparison
OPTIONS = ...
SPEEDS_IN = ...

def plan_command(argv: list[str]) -> str:
    ...
