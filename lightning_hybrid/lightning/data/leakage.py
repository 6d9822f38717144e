# Generated from lightning_hybrid/data/leakage.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""Data leakage between the train, validation and test splits, refused before training.

A model evaluated on subjects it trained on looks better than it is: Wen et al. (2020) found that
leakage explains most AD vs CN accuracies above 0.95 in the literature. Three kinds are refused,
each offender named (the subject as every spelling wrote it, the session, the file and line):

* the same session listed twice (in one split or two);
* a subject in two splits, after ADNI's spellings are made one (PTID, BIDS ``sub-ADNI...`` and RID),
  in particular a subject's sessions split across train and test;
* the same image twice under two names (found by the hash of its voxels).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Offenders listed in full in the error; the rest are counted.
SHOWN = 12


class LeakageError(ValueError):
    """Splits that share a subject, a session or an image; the message names each offender."""


@dataclass(frozen=True)
class Scan:
    """One image of the cohort: the subject as written and as one key, the session, the file, the label."""

    participant: str
    subject: str
    session: str
    path: Path
    label: int
    source: str  # "file, line N": where it was listed


def _where(scan: Scan) -> str:
    return f"{scan.participant} {scan.session} ({scan.source})"


def _listed_twice(splits: Mapping[str, Sequence[Scan]]) -> list[str]:
    first: dict[tuple[str, str], tuple[str, Scan]] = {}
    problems = []
    for split, scans in splits.items():
        for scan in scans:
            key = (scan.subject, scan.session or str(scan.path))  # without sessions, an image is a session
            if key in first:
                other_split, other = first[key]
                problems.append(f"session listed twice: {_where(other)} in {other_split} and {_where(scan)} in {split}")
            else:
                first[key] = (split, scan)
    return problems


def _subjects_in_two_splits(splits: Mapping[str, Sequence[Scan]]) -> list[str]:
    where: dict[str, dict[str, list[Scan]]] = defaultdict(lambda: defaultdict(list))
    for split, scans in splits.items():
        for scan in scans:
            where[scan.subject][split].append(scan)
    problems = []
    for subject, by_split in sorted(where.items()):
        if len(by_split) < 2:
            continue
        spellings = sorted({s.participant for scans in by_split.values() for s in scans})
        sessions = {split: sorted({s.session for s in scans}) for split, scans in by_split.items()}
        listed = "; ".join(f"{split}: {', '.join(sessions[split])} ({by_split[split][0].source})" for split in by_split)
        kind = ("its sessions are split across train and test" if {"train", "test"} <= set(by_split)
                and not set(sessions["train"]) & set(sessions["test"]) else f"it is in {' and '.join(by_split)}")
        spelled = f" (spelled {', '.join(spellings)})" if len(spellings) > 1 else ""
        problems.append(f"subject {subject}{spelled}: {kind}; {listed}")
    return problems


def _same_image_twice(splits: Mapping[str, Sequence[Scan]], hashes: Mapping[Path, str]) -> list[str]:
    by_hash: dict[str, list[tuple[str, Scan]]] = defaultdict(list)
    for split, scans in splits.items():
        for scan in scans:
            if scan.path in hashes:
                by_hash[hashes[scan.path]].append((split, scan))
    problems = []
    for digest, copies in by_hash.items():
        distinct = {(s.subject, s.session or str(s.path)) for _, s in copies}
        if len(distinct) > 1:
            listed = " and ".join(f"{_where(s)} in {split}: {s.path}" for split, s in copies)
            problems.append(f"the same image (sha1 of its voxels {digest[:12]}) twice: {listed}")
    return problems


def check_leakage(splits: Mapping[str, Sequence[Scan]], hashes: Mapping[Path, str] | None = None) -> None:
    """Raise :class:`LeakageError` naming every session listed twice, subject in two splits and image
    found twice (``hashes``: each scan's voxel hash, when known); return quietly otherwise."""
    problems = _listed_twice(splits) + _subjects_in_two_splits(splits) + _same_image_twice(splits, hashes or {})
    if not problems:
        return
    shown = "\n  ".join(problems[:SHOWN])
    more = f"\n  ... and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
    raise LeakageError(
        f"data leakage between the splits ({len(problems)} problem{'s' if len(problems) > 1 else ''}); a model "
        f"evaluated on subjects it trained on looks better than it is, so training is refused:\n  {shown}{more}\n"
        "Split by subject (ClinicaDL: clinicadl tsvtools split / kfold), list each session once, and remove copied "
        "images; skip_leak_check=true skips this check (as clinicadl's --skip_leak_check)."
    )
