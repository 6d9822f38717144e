"""The command's configuration as the tests compose it (tests/cli/test_configs.py and the tests of the
deprecated names, the namespace and the tutorial): a composed run, and every strategy alias the suite registers."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict


def compose_run(tmp_path: Path, *overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_module("lightning_hybrid.configs", version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[f"paths.root_dir={tmp_path}", f"paths.output_dir={tmp_path / 'out'}", *overrides],
            return_hydra_config=True,
        )
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def suite_aliases() -> dict[str, tuple[type, dict]]:
    """Every strategy alias the suite registers with Lightning: its class and the settings it stands for."""
    from lightning_hybrid.strategies import (
        DelayedAveragingStrategy, BalancedDataParallelStrategy, CNeuralStrategy, HybridParallelStrategy, LocalSGDStrategy,
        PartitionedInferenceStrategy, SSPStrategy,
    )

    classes = (SSPStrategy, CNeuralStrategy, DelayedAveragingStrategy, LocalSGDStrategy, HybridParallelStrategy,
               PartitionedInferenceStrategy, BalancedDataParallelStrategy)
    return {name: (cls, params) for cls in classes for name, (_, params) in cls.aliases.items()}
