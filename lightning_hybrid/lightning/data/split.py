# Generated from lightning_hybrid/data/split.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""Deterministic, seeded splits: of indices, and of a cohort's scans by subject (stratified by class, or one
fold of a k-fold), with a check that no split asked for came out empty."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np

from lightning_hybrid.lightning.data.leakage import Scan


def seeded_split(n: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split ``range(n)`` into sorted train and validation indices, the same for the same seed.

    The validation part has ``round(n * val_fraction)`` indices (at least one when the fraction
    is positive and ``n > 1``), chosen by a permutation from ``numpy.random.default_rng(seed)``.
    """
    n_val = int(round(n * val_fraction))
    if val_fraction > 0 and n > 1:
        n_val = min(max(n_val, 1), n - 1)
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def split_subjects(
    scans: Sequence[Scan], val_fraction: float, test_fraction: float, seed: int, folds: int | None, fold: int
) -> tuple[list[Scan], list[Scan], list[Scan]]:
    """Train, validation and test scans; a subject's scans stay together; stratified per class, seeded.

    With ``folds``, the test split is fold ``fold`` of a stratified k-fold over subjects, and the
    validation split ``val_fraction`` of the rest.
    """
    by_subject: dict[str, list[Scan]] = defaultdict(list)
    for scan in scans:
        by_subject[scan.subject].append(scan)
    by_class: dict[int, list[str]] = defaultdict(list)
    for subject, subject_scans in sorted(by_subject.items()):
        label = Counter(s.label for s in subject_scans).most_common(1)[0][0]
        by_class[label].append(subject)
    rng = np.random.default_rng(seed)
    train, val, test = [], [], []
    for label in sorted(by_class):
        subjects = list(by_class[label])
        rng.shuffle(subjects)
        n = len(subjects)
        if folds:
            test_part = subjects[fold::folds]
            rest = [s for s in subjects if s not in set(test_part)]
        else:
            n_test = int(round(n * test_fraction))
            test_part, rest = subjects[:n_test], subjects[n_test:]
        n_val = int(round(len(rest) * val_fraction / (1 - (0 if folds else test_fraction))))
        test += test_part
        val += rest[:n_val]
        train += rest[n_val:]
    pick = lambda names: [scan for name in names for scan in by_subject[name]]  # noqa: E731
    return pick(train), pick(val), pick(test)


def check_splits(
    splits: dict[str, Sequence[Scan]], scans: Sequence[Scan], fractions: dict[str, float | None], labels: Sequence[str]
) -> None:
    """Raise a ValueError naming the cohort's numbers when a split asked for (fraction > 0, or a
    cross-validation fold or split file: ``None``) came out empty: its metrics would silently be missing."""
    for split, fraction in fractions.items():
        if splits[split] or fraction == 0:
            continue
        subjects = {label: len({s.subject for s in scans if s.label == index}) for index, label in enumerate(labels)}
        counts = ", ".join(f"{n} {label}" for label, n in subjects.items())
        asked = f"data.split.{split}_fraction={fraction}" if fraction is not None else "the cross-validation fold or split file"
        raise ValueError(
            f"ADNI {' vs '.join(labels)}: the {split} split is empty. The cohort has {len({s.subject for s in scans})} "
            f"subjects ({counts}; {len(scans)} scans) and {asked} gives 0 subjects "
            f"per class (splits are by subject, stratified by class). Use a larger cohort (more subjects per class), "
            f"raise data.split.{split}_fraction, or set data.split.{split}_fraction=0 to go without a {split} set."
        )
