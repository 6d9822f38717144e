# Generated from lightning_hybrid/cli/resume.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""``ckpt_path=auto`` (the CLI's default): which checkpoint a run resumes from, and its folder's record.

* A run whose folder holds a checkpoint resumes from the newest one when the folder's ``run.yaml``
  records the same configuration (the same command rerun in a fixed folder, ``hydra.run.dir=...``,
  or a requeued SLURM job); another configuration is refused, naming the keys that differ.
* A run in a new folder (Hydra's timestamped ``outputs/runs/<time>``) started by hand resumes the
  most recent interrupted run of the same configuration among its sibling folders, and writes on in
  that folder (this folder keeps only Hydra's log of the command).
* ``ckpt_path=null`` starts afresh; ``ckpt_path=<file>`` resumes from that file as Lightning does.

The decision is taken once, by the process the command started, and handed to the ranks Lightning's
launcher starts through :data:`DECISION_ENV`; ranks started by SLURM or torchrun each decide alike
(same files), without the sibling search (their folder is fixed by the launcher).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from lightning_hybrid.lightning import run_folder
from lightning_hybrid.lightning.cli.relaunch import in_multirun

log = logging.getLogger("lightning_hybrid")

#: Where the command's process leaves its decision for the ranks Lightning's launcher starts.
DECISION_ENV = "LIGHTNING_HYBRID_RESUME"
#: Variables that mark a process started as a rank by a launcher (Lightning's, torchrun, SLURM's srun).
_RANK_VARIABLES = ("LOCAL_RANK", "RANK", "SLURM_PROCID")


def compared_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config without the keys that do not change what the run computes; the run folder
    reads ``<run folder>`` wherever it appears (checkpoint and logger folders)."""
    copy = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    with open_dict(copy):
        copy.paths.output_dir = "<run folder>"
    return run_folder.compared(OmegaConf.to_container(copy, resolve=True))


def _started_as_a_rank() -> bool:
    return any(name in os.environ for name in _RANK_VARIABLES)


def resolve_ckpt_path(cfg: DictConfig) -> str | None:
    """The checkpoint this run resumes from (see the module docstring); may move the run's outputs
    (``paths.output_dir``) to the interrupted run's folder. Raises ``ResumeRefused``."""
    if cfg.get("ckpt_path") != "auto":
        return cfg.get("ckpt_path")
    if not cfg.get("fit", True):
        return None  # testing only: the weights to test are named by a path
    if (handed := os.environ.get(DECISION_ENV)) is not None:
        decision = json.loads(handed)
    else:
        decision = _decide(cfg)
        os.environ[DECISION_ENV] = json.dumps(decision)  # the ranks Lightning starts inherit it
    if decision["output_dir"] != str(cfg.paths.output_dir):
        with read_write(cfg), open_dict(cfg):
            cfg.paths.output_dir = decision["output_dir"]
    return decision["checkpoint"]


def _decide(cfg: DictConfig) -> dict[str, Any]:
    folder, config = Path(cfg.paths.output_dir), compared_config(cfg)
    checkpoint = run_folder.checkpoint_to_resume(folder, config)
    if checkpoint is None and not _started_as_a_rank() and not in_multirun():
        interrupted = run_folder.interrupted_run(folder, config)
        if interrupted is not None:
            checkpoint = run_folder.checkpoint_to_resume(interrupted, config)
            log.info("resuming the interrupted run of this configuration in %s (from %s); this folder keeps only "
                     "the command's log (ckpt_path=null starts afresh instead)", interrupted, checkpoint.name)
            folder = interrupted
    elif checkpoint is not None:
        log.info("resuming from %s (the newest checkpoint of this configuration in the run folder; ckpt_path=null "
                 "starts afresh)", checkpoint)
    if checkpoint is None and (run_folder.read_record(folder) or {}).get("status") == "interrupted":
        log.info("starting over: the interrupted run in %s stopped before it saved a checkpoint", folder)
    return {"output_dir": str(folder), "checkpoint": None if checkpoint is None else str(checkpoint)}


def record_start(cfg: DictConfig, config: dict[str, Any]) -> None:
    """Rank 0: the run folder's record of ``config`` (:func:`compared_config` of the run as given), status
    ``running``."""
    run_folder.write_record(Path(cfg.paths.output_dir), config, "running")


def record_end(cfg: DictConfig, status: str, **details: Any) -> None:
    run_folder.update_status(Path(cfg.paths.output_dir), status, **details)
