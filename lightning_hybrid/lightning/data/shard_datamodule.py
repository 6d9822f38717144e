# Generated from lightning_hybrid/data/shard_datamodule.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""A datamodule over a shard store: each worker loads its own shards once, in parallel, and keeps them.

cNeural's "load once, read many" (paper 002): worker ``r`` of ``W`` reads the shards
:func:`~lightning_hybrid.data.shards.assign_shards` gives it (all workers read at the same time,
each with a few threads), checks them against their md5 and its memory quota, and keeps them
resident for every epoch, in the stored dtype (uint8 images stay uint8; each batch is converted to
float when it is drawn). Validation and test sets come from stores of their own and are sharded
by Lightning as usual.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader

from lightning_hybrid.data.resident_shards import ResidentShards, batch_as_is
from lightning_hybrid.data.samplers import LocalShuffleSampler
from lightning_hybrid.data.shards import ShardError, ShardStore, assign_shards, logical_workers
from lightning_hybrid.devices import parse_size

log = logging.getLogger(__name__)


class ShardDataModule(pl.LightningDataModule):
    """Training data from a shard store, loaded once per worker in parallel and kept resident.

    Args:
        train_store: the training store (a folder or an fsspec URL), written by
            ``lightning-hybrid data pack`` or ``data augment-mnist``.
        val_store, test_store: stores for validation and test (``None``: no validation; asking
            for a test set that was not given is an error). ``test`` also serves ``predict``.
        batch_size: mini-batch size (under the ``cneural`` strategy the gradient is summed over
            the whole shard anyway; the batch size only bounds memory).
        quota: memory a worker may hold for its shards (``"2GiB"``, or bytes). A quota smaller
            than one shard, or a worker share larger than the quota, is refused with the numbers.
        mean, std: normalization after integer images are scaled to [0, 1] (MNIST: 0.1307, 0.3081).
        resident: ``False`` reloads the shards from the store at every epoch (the MapReduce-style
            baseline of the paper's comparison; needs ``reload_dataloaders_every_n_epochs=1``).
        load_threads: concurrent shard reads per worker.
        seed: shuffling seed.
        num_workers: DataLoader worker processes (0: batches are slices of resident memory).

    After ``setup``, ``load_seconds`` is how long this worker took to load its share and
    ``logical_workers`` is cNeural's ``k = min(cores, memory / quota)`` for this machine; more
    local workers than the memory allows is refused, more than the cores is warned about.

    Example::

        >>> from lightning_hybrid.lightning.data import ShardDataModule
        >>> dm = ShardDataModule("data/mnist_aug_500k", val_store="data/mnist_test", quota="2GiB")
        >>> # pl.Trainer(strategy="cneural", devices=dm_k).fit(model, datamodule=dm)
    """

    def __init__(
        self,
        train_store: str,
        val_store: str | None = None,
        test_store: str | None = None,
        batch_size: int = 1000,
        quota: str | int | float = "2GiB",
        mean: float | None = None,
        std: float | None = None,
        resident: bool = True,
        load_threads: int = 4,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.quota_bytes = parse_size(quota)
        if self.quota_bytes <= 0:
            raise ValueError(f"quota must be positive, got {quota!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.train_set: ResidentShards | None = None
        self.val_set: ResidentShards | None = None
        self.test_set: ResidentShards | None = None
        self.load_seconds: float | None = None
        self.logical_workers: int | None = None
        self._share: tuple[int, int] = (0, 1)
        self._used = False  # whether the loaded share has served an epoch (resident=False reloads after that)

    # ------------------------------------------------------------------ loading
    def _placement(self) -> tuple[int, int, int]:
        """(rank, world size, workers on this machine) from the attached trainer, else one worker."""
        trainer = self.trainer
        if trainer is None:
            return 0, 1, 1
        return trainer.global_rank, trainer.world_size, max(1, trainer.num_devices)

    def load_share(self, rank: int, world_size: int) -> ResidentShards:
        """Worker ``rank`` of ``world_size``: check the quota, read its shards (timed), keep them."""
        start = time.perf_counter()
        share = self.read_share(rank, world_size)
        self.load_seconds = time.perf_counter() - start
        self._share = (rank, world_size)
        return share

    def read_share(self, rank: int, world_size: int) -> ResidentShards:
        """The shards of worker ``rank`` of ``world_size`` (quota checked), without making them this
        worker's own: what a worker that takes over a lost one's share reads (cNeural)."""
        store = ShardStore(self.hparams.train_store)
        if world_size > store.num_shards:
            raise ShardError(
                f"{store.root} has {store.num_shards} shards for {world_size} workers, so some worker would get none; "
                "repack with a smaller --shard-size or use fewer workers"
            )
        store.check_quota(self.quota_bytes, world_size)
        x, y = store.load(assign_shards(store.num_shards, world_size, rank), threads=self.hparams.load_threads)
        return ResidentShards(x, y, self.hparams.mean, self.hparams.std)

    def _load_whole(self, root: str | None) -> ResidentShards | None:
        if root is None:
            return None
        store = ShardStore(root)
        x, y = store.load(list(range(store.num_shards)), threads=self.hparams.load_threads)
        return ResidentShards(x, y, self.hparams.mean, self.hparams.std)

    def _check_machine(self, local_workers: int) -> None:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        cores = os.cpu_count() or 1
        self.logical_workers = logical_workers(self.quota_bytes, cores, memory)
        if local_workers * self.quota_bytes > memory:
            raise ShardError(
                f"{local_workers} workers x quota {self.quota_bytes / 2**30:.2f} GiB exceed this machine's memory "
                f"({memory / 2**30:.2f} GiB): it hosts k = min(cores, memory / quota) = {self.logical_workers} workers; "
                "use fewer devices or a smaller quota"
            )
        if local_workers > self.logical_workers:
            log.warning("%d workers on this machine, but k = min(cores=%d, memory/quota) = %d", local_workers, cores,
                        self.logical_workers)

    def setup(self, stage: str | None = None) -> None:
        rank, world_size, local_workers = self._placement()
        if stage in (None, "fit"):
            trainer = self.trainer
            if not self.hparams.resident and trainer is not None and trainer.reload_dataloaders_every_n_epochs != 1:
                raise ValueError(
                    "ShardDataModule(resident=False) reloads the shards every epoch from train_dataloader(); set "
                    f"trainer.reload_dataloaders_every_n_epochs=1 (it is {trainer.reload_dataloaders_every_n_epochs})"
                )
            self._check_machine(local_workers)
            if self.train_set is None or self._share != (rank, world_size):
                self.train_set = self.load_share(rank, world_size)
                self._used = False
                log.info("worker %d/%d: %d resident samples (%.1f MiB) loaded in %.2f s", rank, world_size,
                         len(self.train_set), self.train_set.nbytes / 2**20, self.load_seconds)
        if stage in (None, "fit", "validate") and self.val_set is None:
            self.val_set = self._load_whole(self.hparams.val_store)
        if stage in (None, "test", "predict") and self.test_set is None:
            self.test_set = self._load_whole(self.hparams.test_store)

    # ------------------------------------------------------------------ loaders
    def _loader(self, dataset: ResidentShards | None, name: str, sampler: Any = None) -> DataLoader:
        if dataset is None:
            raise ValueError(f"ShardDataModule has no {name} set: pass {name}_store (a store folder or URL)")
        workers = self.hparams.num_workers
        return DataLoader(
            dataset, batch_size=self.hparams.batch_size, sampler=sampler, collate_fn=batch_as_is,
            num_workers=workers, persistent_workers=workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        if self.train_set is None:
            raise RuntimeError("ShardDataModule.setup('fit') must run before train_dataloader()")
        if not self.hparams.resident and self._used:  # the baseline: read the shards again, every epoch
            self.train_set = self.load_share(*self._share)
        self._used = True
        rank = self._share[0]
        return self._loader(self.train_set, "train", LocalShuffleSampler(self.train_set, self.hparams.seed, rank))

    def val_dataloader(self) -> DataLoader | list:
        if self.val_set is None:  # validation is optional: no val_store, no validation
            return []
        return self._loader(self.val_set, "val")

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, "test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, "test")
