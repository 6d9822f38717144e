"""The sharded dataset store: round trip (local folder and an fsspec URL), loading across processes,
and the errors for missing or corrupt shards and too small quotas."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from lightning_hybrid.data.shards import ShardError, ShardStore, assign_shards, logical_workers, pack


def data(n: int = 103) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.integers(0, 255, (n, 1, 28, 28), dtype=np.uint8), np.arange(n, dtype=np.int64)


@pytest.mark.parametrize("where", ["local", "memory"])
def test_round_trip(tmp_path, where):
    x, y = data()
    root = str(tmp_path / "store") if where == "local" else "memory://test-round-trip"
    store = pack(x, y, root, shard_size=25)
    assert store.num_shards == 5 and store.num_samples == 103
    assert [s["samples"] for s in ShardStore(root).shards] == [25, 25, 25, 25, 3]
    got_x, got_y = ShardStore(root).load(range(5))
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_y, y)


def _load_ids(root: str, workers: int, rank: int) -> list[int]:
    store = ShardStore(root)
    return store.load(assign_shards(store.num_shards, workers, rank))[1].tolist()


def test_parallel_loading_gives_every_sample_once_across_worker_processes(tmp_path):
    x, y = data()
    root = str(tmp_path / "store")
    pack(x, y, root, shard_size=10)
    workers = 3
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver")) as pool:
        parts = list(pool.map(_load_ids, [root] * workers, [workers] * workers, range(workers)))
    assert all(parts)
    ids = [i for part in parts for i in part]
    assert sorted(ids) == list(range(103)) and len(ids) == len(set(ids))


def test_missing_and_corrupt_shards_are_named(tmp_path):
    x, y = data()
    root = tmp_path / "store"
    pack(x, y, str(root), shard_size=25)
    (root / "shard-00002.npz").unlink()
    with pytest.raises(ShardError, match="shard shard-00002.npz of .* is missing"):
        ShardStore(str(root)).load(range(5))
    pack(x, y, str(root), shard_size=25)
    raw = bytearray((root / "shard-00001.npz").read_bytes())
    raw[-10] ^= 0xFF
    (root / "shard-00001.npz").write_bytes(bytes(raw))
    with pytest.raises(ShardError, match="shard shard-00001.npz of .* is corrupt"):
        ShardStore(str(root)).load([1])
    with pytest.raises(ShardError, match="manifest.json is missing"):
        ShardStore(str(tmp_path))


def test_quota_errors_and_logical_workers(tmp_path):
    x, y = data()
    store = pack(x, y, str(tmp_path / "store"), shard_size=25)
    one = store.largest_shard_bytes
    with pytest.raises(ShardError, match="smaller than one shard"):
        store.check_quota(one - 1, workers=2)
    with pytest.raises(ShardError, match="too big for the quota: worker 0 of 2"):
        store.check_quota(one * 2, workers=2)  # worker 0 holds shards 0, 2, 4
    store.check_quota(one * 3, workers=2)
    assert logical_workers(quota_bytes=4 * 2**30, cores=16, memory_bytes=24 * 2**30) == 6
    assert logical_workers(quota_bytes=1 * 2**30, cores=2, memory_bytes=24 * 2**30) == 2
    with pytest.raises(ShardError, match="larger than this machine's memory"):
        logical_workers(quota_bytes=32 * 2**30, cores=2, memory_bytes=24 * 2**30)
    assert logical_workers(quota_bytes=2**20) >= 1  # this machine's cores and memory


def test_pack_command_writes_real_mnist_as_a_store(tmp_path, real_mnist):
    from lightning_hybrid.cli.data import data_command

    data_command(["pack", "--root", str(real_mnist), "--out", str(tmp_path / "store"), "--split", "test",
                  "--shard-size", "3000"])
    store = ShardStore(str(tmp_path / "store"))
    assert store.num_samples == 10000 and store.num_shards == 4
    x, y = store.load([3])
    assert x.shape == (1000, 1, 28, 28) and x.dtype == np.uint8 and set(y.tolist()) <= set(range(10))
