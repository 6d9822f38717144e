# Generated from lightning_hybrid/cli/relaunch.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""Child ranks under Hydra sweeps: Lightning's subprocess launcher made to rerun only the current job.

Lightning starts ranks 1..N-1 of a multi-process strategy by rerunning the command line; in a Hydra
multirun that command line is the whole sweep. :func:`child_ranks_rerun_this_job` narrows it to the
job being run, in the job's own folder.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import read_write

# Command-line flags of Hydra itself that select which config is composed (kept for child ranks).
_CONFIG_FLAGS = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd")


def _selected_config_flags(argv: list[str]) -> list[str]:
    """The ``--config-name``-style flags (with their values) from a command line."""
    kept: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg in _CONFIG_FLAGS:
            kept += [arg, next(args, "")]
        elif arg.split("=", 1)[0] in _CONFIG_FLAGS:
            kept.append(arg)
    return kept


def in_multirun() -> bool:
    """Whether this is a job of a Hydra multirun (``-m``)."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


@contextmanager
def child_ranks_rerun_this_job() -> Iterator[None]:
    """Make Lightning's subprocess launcher start the other ranks on *this* job of a sweep.

    Lightning starts ranks 1..N-1 by rerunning ``sys.argv`` with ``hydra.run.dir`` set to the
    run directory. In a multirun, ``sys.argv`` holds the whole sweep (``-m lr=0.1,0.2``) and
    ``hydra.run.dir`` is not the job's folder, so each child would start a sweep of its own in the
    wrong place (lightning-hydra-template issue 393). For the duration of the job, ``sys.argv`` is
    replaced by this job's own overrides and the run directory by the job's output folder.
    """
    if not in_multirun():
        yield
        return
    hydra_cfg = HydraConfig.get()
    saved_argv, saved_dir = sys.argv, hydra_cfg.run.dir
    sys.argv = [saved_argv[0], *_selected_config_flags(saved_argv[1:]), *hydra_cfg.overrides.task]
    with read_write(hydra_cfg.run):
        hydra_cfg.run.dir = hydra_cfg.runtime.output_dir
    try:
        yield
    finally:
        sys.argv = saved_argv
        with read_write(hydra_cfg.run):
            hydra_cfg.run.dir = saved_dir
