"""A run folder's record of the configuration it trains and how its run ended, and which checkpoint
resumes it (the CLI's ``ckpt_path=auto``).

A run writes ``run.yaml`` into its folder when it starts (status ``running``) and updates it when it
ends (``finished``, ``interrupted``: stopped by a signal, or ``failed``: an error). A later run
resumes from the folder's newest checkpoint only when the folder records the same configuration
(:func:`checkpoint_to_resume`; the keys in :data:`NOT_COMPARED` may differ), and refuses, naming the
keys that differ, otherwise. :func:`interrupted_run` finds an interrupted run of the same
configuration among a run's sibling folders (timestamped folders: the same command run again).
Plain Python and YAML: no Lightning, no Hydra.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from lightning_hybrid.deprecation import current_targets

#: The record's file name in a run folder.
RECORD = "run.yaml"
#: Top-level config keys that do not change what a fit computes (where it writes, how it reports, testing after it).
NOT_COMPARED = ("paths", "ckpt_path", "test", "progress", "progress_every_s", "hydra")
#: Statuses a later run of the same command may resume (an orderly stop, an error): not ``running``
#: (it may be running now) nor ``finished``.
RESUMABLE = ("interrupted", "failed")


class ResumeRefused(ValueError):
    """A run folder holds a checkpoint that ``ckpt_path=auto`` must not resume."""


def compared(config: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a (plain, resolved) config that decides what a run computes (a class renamed since it was
    recorded named as it is now: :data:`~lightning_hybrid.deprecation.RENAMED_TARGETS`)."""
    return {key: current_targets(value) for key, value in config.items() if key not in NOT_COMPARED}


def read_record(folder: Path) -> dict[str, Any] | None:
    path = Path(folder) / RECORD
    if not path.is_file():
        return None
    return yaml.safe_load(path.read_text()) or None


def write_record(folder: Path, config: Mapping[str, Any], status: str, **details: Any) -> None:
    """Write (atomically) the folder's record: the compared config, the status and any details."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    record = {"status": status, "updated": time.strftime("%Y-%m-%d %H:%M:%S"), **details, "config": compared(config)}
    tmp = folder / f".{RECORD}.tmp"
    tmp.write_text(yaml.safe_dump(record, sort_keys=False))
    tmp.replace(folder / RECORD)


def update_status(folder: Path, status: str, **details: Any) -> None:
    """Change the status (and add details) of an existing record."""
    record = read_record(folder)
    if record is not None:
        kept = {k: v for k, v in record.items() if k not in ("config", "status", "updated")}
        write_record(folder, record["config"], status, **{**kept, **details})


def differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested configs (added and removed keys too)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        keys = sorted(set(old) | set(new), key=str)
        return [d for key in keys for d in differences(old.get(key, _MISSING), new.get(key, _MISSING), f"{prefix}{key}.")]
    return [] if old == new else [prefix.rstrip(".")]


_MISSING = object()


def _shown(value: Any) -> str:
    return "(absent)" if value is _MISSING else repr(value)


def _value(config: Mapping[str, Any], dotted: str) -> Any:
    value: Any = config
    for key in dotted.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return _MISSING
        value = value[key]
    return value


def newest_checkpoint(folder: Path) -> Path | None:
    """The newest ``*.ckpt`` in ``folder/checkpoints`` (a run's epoch-end or interruption checkpoint)."""
    checkpoints = [p for p in (Path(folder) / "checkpoints").glob("*.ckpt") if p.is_file()]
    return max(checkpoints, key=lambda p: p.stat().st_mtime_ns, default=None)


def checkpoint_to_resume(folder: Path, config: Mapping[str, Any]) -> Path | None:
    """The checkpoint in ``folder`` that a run of ``config`` resumes from: its newest, when the folder's
    record has the same configuration; None without a checkpoint. Raises :class:`ResumeRefused` for
    a checkpoint of another (or an unrecorded) configuration."""
    checkpoint = newest_checkpoint(folder)
    if checkpoint is None:
        return None
    how = ("pass ckpt_path=<a checkpoint> to resume from it anyway, ckpt_path=null to start afresh in this folder "
           "(overwriting its checkpoints), or choose another folder (hydra.run.dir=...)")
    record = read_record(folder)
    if record is None or "config" not in record:
        raise ResumeRefused(
            f"{folder} holds checkpoints ({checkpoint.name}) but no {RECORD} saying which configuration made them, so "
            f"ckpt_path=auto does not resume from them: {how}"
        )
    old, new = compared(record["config"]), compared(config)
    changed = differences(old, new)
    if changed:
        shown = "; ".join(f"{key}: {_shown(_value(old, key))} -> {_shown(_value(new, key))}"
                          for key in changed[:10])
        more = f" and {len(changed) - 10} more" if len(changed) > 10 else ""
        raise ResumeRefused(
            f"{folder} holds a checkpoint ({checkpoint.name}) of another configuration ({shown}{more}), so "
            f"ckpt_path=auto does not resume it: {how}"
        )
    return checkpoint


def interrupted_run(folder: Path, config: Mapping[str, Any]) -> Path | None:
    """The most recently updated sibling of ``folder`` whose run of the same configuration was
    interrupted or failed and left a checkpoint (the same command run again in a new, timestamped
    folder); None if there is none."""
    folder = Path(folder)
    if not folder.parent.is_dir():
        return None
    found = []
    for sibling in folder.parent.iterdir():
        if sibling == folder or not sibling.is_dir():
            continue
        record = read_record(sibling)
        if (record and record.get("status") in RESUMABLE and newest_checkpoint(sibling) is not None
                and not differences(compared(record.get("config") or {}), compared(config))):
            found.append(sibling)
    return max(found, key=lambda s: (s / RECORD).stat().st_mtime_ns, default=None)
