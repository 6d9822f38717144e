# Generated from lightning_hybrid/data/adni.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
from __future__ import annotations
import hashlib
import json
import logging
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any
import torch
from torch.utils.data import DataLoader, Dataset
from lightning_hybrid.lightning.data import clinicadl
from lightning_hybrid.lightning.data.base import EpochSeededRandomSampler, InMemoryDataModule
from lightning_hybrid.data.adni_settings import FLAT_NAMES, Augment, Cache, Source, Split, View, moved_keywords, settings
from lightning_hybrid.data.clinicadl import ClinicaDLFormatError, Row
from lightning_hybrid.data.clinicadl_splits import split_files
from lightning_hybrid.data.adni_csv import read_csv_rows
from lightning_hybrid.data.leakage import Scan, check_leakage
from lightning_hybrid.data.split import check_splits, split_subjects
from lightning_hybrid.data.volume_augment import VolumeAugment
from lightning_hybrid.data.volume_datasets import Volumes, VolumesOn, in_threads
from lightning_hybrid.data.volume_files import BadItemError, InspectionCache
log = ...
TASKS = ...

class ADNIDataModule(InMemoryDataModule):
    drop_last_train = ...
    monitor = ...

    def __init__(self, source: Source | Mapping[str, Any] | None=None, task: str='AD_vs_CN', diagnoses: Sequence[str] | None=None, split: Split | Mapping[str, Any]=Split(), view: View | Mapping[str, Any]=View(), augment: Augment | Mapping[str, Any] | None=Augment(), cache: Cache | Mapping[str, Any] | None=Cache(), batch_size: int=6, seed: int=0, num_workers: int | str='auto', pin_memory: bool | str='auto', prefetch_factor: int=4, **moved: Any) -> None:
        ...

    @property
    def labels(self) -> list[str]:
        ...

    @property
    def num_classes(self) -> int:
        ...

    @property
    def positive_class(self) -> int:
        ...

    def _rows(self) -> dict[str, list[tuple[Row, Path | None]]] | list[tuple[Row, Path | None]]:
        ...

    def _read_tsvs(self, paths: Sequence[Path], skipped: list[str] | None) -> list[Row]:
        ...

    def _scan(self, row: Row, image: Path | None) -> Scan:
        ...

    def _scans(self, rows: Sequence[tuple[Row, Path | None]], what: str) -> list[Scan]:
        ...

    def _inspected(self, scans: list[Scan]) -> tuple[list[Scan], dict[Path, str]]:
        ...

    @staticmethod
    def baseline_of(scans: Sequence[Scan]) -> list[Scan]:
        ...

    def read_splits(self) -> dict[str, list[Scan]]:
        ...

    def preprocessing(self, keep_meta: bool=False) -> Any:
        ...

    def _preprocessed(self, scans: Sequence[Scan], split: str) -> Sequence[Any] | Dataset:
        ...

    def _dataset(self, scans: Sequence[Scan], split: str) -> Dataset:
        ...

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        ...

    @property
    def device_cache(self) -> torch.device | None:
        ...

    def _loader(self, dataset: Dataset | None, shuffle: bool) -> DataLoader:
        ...

    @property
    def loader_workers(self) -> int:
        ...

    def build(self) -> tuple[Dataset, Dataset, Dataset]:
        ...

class SyntheticADNIDataModule(ADNIDataModule):

    def __init__(self, root: str | Path, subjects: int=40, volume_shape: Sequence[int]=(64, 76, 64), synth_seed: int=0, source: None=None, **kwargs: Any) -> None:
        ...
