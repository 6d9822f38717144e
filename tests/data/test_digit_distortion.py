"""Distortions of digit images, the streaming shard writer, and MNIST expanded into a shard store
(`augment_mnist`, `lightning-hybrid data augment-mnist`)."""

from __future__ import annotations

import hashlib
import json
import logging

import numpy as np
import pytest
from conftest import write_tiny_mnist

from lightning_hybrid.data.digit_distortion import Distortion, augment_mnist, distort
from lightning_hybrid.data.idx import read_idx
from lightning_hybrid.data.shards import ShardError, ShardStore, ShardWriter, pack

# Digit-like shapes, one per label: polylines in (row, col) on a 28x28 canvas.
SHAPES = {
    0: [(6, 14), (8, 9), (14, 8), (20, 9), (22, 14), (20, 19), (14, 20), (8, 19), (6, 14)],  # a ring
    1: [(5, 14), (23, 14)],
    4: [(5, 17), (16, 8), (16, 20), (16, 17), (5, 17), (23, 17)],
    7: [(6, 8), (6, 20), (23, 12)],
    8: [(6, 14), (10, 10), (14, 14), (18, 18), (22, 14), (18, 10), (14, 14), (10, 18), (6, 14)],
}


def draw(points: list[tuple[float, float]], shift: tuple[float, float] = (0, 0), width: float = 1.6) -> np.ndarray:
    """An anti-aliased stroke through ``points`` (like a pen digit), uint8 28x28."""
    rows, cols = np.mgrid[0:28, 0:28].astype(float)
    dist = np.full((28, 28), np.inf)
    for (r0, c0), (r1, c1) in zip(points[:-1], points[1:]):
        r0, c0, r1, c1 = r0 + shift[0], c0 + shift[1], r1 + shift[0], c1 + shift[1]
        dr, dc = r1 - r0, c1 - c0
        t = np.clip(((rows - r0) * dr + (cols - c0) * dc) / max(dr * dr + dc * dc, 1e-9), 0, 1)
        dist = np.minimum(dist, np.hypot(rows - r0 - t * dr, cols - c0 - t * dc))
    return (255 * np.clip(width + 0.5 - dist, 0, 1)).astype(np.uint8)


def digits(n: int = 40, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` stroke digits of the labels in SHAPES, each slightly shifted."""
    rng = np.random.default_rng(seed)
    labels = np.array(list(SHAPES))[np.arange(n) % len(SHAPES)]
    images = np.stack([draw(SHAPES[int(label)], tuple(rng.uniform(-1.5, 1.5, 2))) for label in labels])
    return images, labels


def correlation(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.reshape(len(a), -1).astype(float)
    b = b.reshape(len(b), -1).astype(float)
    a, b = a - a.mean(1, keepdims=True), b - b.mean(1, keepdims=True)
    return (a * b).sum(1) / np.sqrt((a * a).sum(1) * (b * b).sum(1))


def ink(images: np.ndarray) -> np.ndarray:
    return images.reshape(len(images), -1).sum(1).astype(float)


# --- distortions ---------------------------------------------------------------------------------


def test_distort_keeps_shape_and_dtype_and_is_seeded():
    images, _ = digits(12)
    out = distort(images, seed=3)
    assert out.shape == images.shape and out.dtype == np.uint8
    np.testing.assert_array_equal(distort(images, seed=3), out)
    np.testing.assert_array_equal(distort(images, seed=np.random.default_rng(3)), out)
    assert (distort(images, seed=4) != out).any()
    assert all((distort(images, seed=4)[i] != out[i]).any() for i in range(len(images)))  # every image redrawn
    wide = distort(np.zeros((3, 20, 32), np.uint8), seed=0)
    assert wide.shape == (3, 20, 32) and not wide.any()
    assert distort(np.zeros((0, 28, 28), np.uint8), seed=0).shape == (0, 28, 28)


def test_distorted_digits_differ_from_their_source_but_stay_close():
    images, _ = digits(40)
    out = distort(images, seed=0)
    corr = correlation(images, out)
    assert 0.5 < corr.mean() < 0.999 and (corr < 0.999).all()
    ratio = ink(out) / ink(images)
    assert 0.85 < ratio.mean() < 1.15 and ((0.4 < ratio) & (ratio < 2.5)).all()
    # Each part on its own distorts, and the affine part alone is milder than both together.
    affine = correlation(images, distort(images, seed=0, distortion=Distortion(alpha=0)))
    elastic = correlation(images, distort(images, seed=0, distortion=Distortion(rotation=0, scale=(1, 1), shear=0)))
    assert affine.mean() < 0.999 and elastic.mean() < 0.999 and affine.mean() > corr.mean()


def test_identity_parameters_return_the_source():
    images, _ = digits(10)
    images[0] = 255  # ink up to the border: nothing may fade at the edges
    np.testing.assert_array_equal(distort(images, seed=0, distortion=Distortion.none()), images)
    nearly = distort(images, seed=0, distortion=Distortion(alpha=0.01, rotation=0.01, scale=(1, 1.0001), shear=1e-4))
    assert np.abs(nearly.astype(int) - images).max() <= 2


def test_affine_scale_enlarges_and_shrinks_the_digit():
    images, _ = digits(10)
    bigger = distort(images, seed=0, distortion=Distortion(alpha=0, rotation=0, scale=(1.2, 1.2), shear=0))
    smaller = distort(images, seed=0, distortion=Distortion(alpha=0, rotation=0, scale=(0.8, 0.8), shear=0))
    # Stroke length grows with the scale (the width too, as a picture is scaled), so ink ~ scale**2.
    assert 1.3 < (ink(bigger) / ink(images)).mean() < 1.6
    assert 0.55 < (ink(smaller) / ink(images)).mean() < 0.75


def test_images_of_a_batch_never_mix():
    images = np.zeros((9, 28, 28), np.uint8)
    images[::2] = 255  # full images next to blank ones
    out = distort(images, seed=0)
    assert not out[1::2].any()
    assert (out[::2, 10:18, 10:18] == 255).all()  # the centre of a full image stays full


def test_bad_input_is_refused_with_a_clear_message(tmp_path):
    images, labels = digits(5)
    with pytest.raises(ValueError, match=r"images must have shape \(N, H, W\), got \(5, 784\)"):
        distort(images.reshape(5, -1))
    with pytest.raises(ValueError, match=r"shape \(N, H, W\), got \(5, 1, 28, 28\)"):
        augment_mnist(images[:, None], labels, 10, str(tmp_path / "s"))
    with pytest.raises(ValueError, match="must be uint8"):
        distort(images.astype(np.float32))
    with pytest.raises(ValueError, match=r"samples must be an integer >= 1, got 0"):
        augment_mnist(images, labels, 0, str(tmp_path / "s"))
    with pytest.raises(ValueError, match=r"labels must have shape \(5,\), one per image, got \(4,\)"):
        augment_mnist(images, labels[:4], 10, str(tmp_path / "s"))
    with pytest.raises(ValueError, match="no source images"):
        augment_mnist(images[:0], labels[:0], 10, str(tmp_path / "s"))
    with pytest.raises(ValueError, match="shard_size must be >= 1"):
        augment_mnist(images, labels, 10, str(tmp_path / "s"), shard_size=0)
    with pytest.raises(ValueError, match="sigma must be > 0"):
        Distortion(sigma=0)
    with pytest.raises(ValueError, match="0 < low <= high"):
        Distortion(scale=(1.2, 1.0))
    with pytest.raises(ValueError, match="shear must be in"):
        Distortion(shear=2.0)


# --- the streaming shard writer ------------------------------------------------------------------


@pytest.mark.parametrize("where", ["local", "memory"])
def test_shard_writer_round_trip_in_order(tmp_path, where):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, (103, 1, 28, 28), dtype=np.uint8)
    y = np.arange(103, dtype=np.int64)
    expected = x.copy()
    root = str(tmp_path / "store") if where == "local" else "memory://test-shard-writer"
    with ShardWriter(root, shard_size=25) as writer:
        cuts = [0, 0, 3, 20, 21, 70, 71, 103]  # empty batches, batches within a shard and across several
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            writer.write(x[lo:hi], y[lo:hi])
            x[lo:hi] = 0  # the writer must not depend on the caller's arrays after write()
    store = ShardStore(root)
    assert writer.store.num_samples == store.num_samples == 103
    assert [s["samples"] for s in store.shards] == [25, 25, 25, 25, 3]
    for entry in store.shards:
        with store.fs.open(store.path + "/" + entry["name"], "rb") as f:
            data = f.read()
        assert hashlib.md5(data).hexdigest() == entry["md5"] and len(data) == entry["bytes"]
    got_x, got_y = store.load(range(store.num_shards))
    np.testing.assert_array_equal(got_x, expected)
    np.testing.assert_array_equal(got_y, y)
    # pack is the same writer: byte-identical shards and manifest.
    manifest = store.manifest
    pack(expected, y, root, shard_size=25)
    assert ShardStore(root).manifest == manifest


def test_shard_writer_refuses_mixed_batches_and_writes_no_manifest_on_error(tmp_path):
    root = tmp_path / "store"
    with pytest.raises(ValueError, match=r"per-sample shape \(2,\).*first batch .* had \(3,\)"):
        with ShardWriter(str(root), shard_size=2) as writer:
            writer.write(np.zeros((5, 3)), np.zeros(5))
            writer.write(np.zeros((1, 2)), np.zeros(1))
    assert sorted(p.name for p in root.iterdir()) == ["shard-00000.npz", "shard-00001.npz"]
    with pytest.raises(ShardError, match="manifest.json is missing"):
        ShardStore(str(root))
    writer = ShardWriter(str(root), shard_size=2)
    with pytest.raises(ValueError, match="x has 2 samples but y has 3"):
        writer.write(np.zeros((2, 3)), np.zeros(3))
    with pytest.raises(ShardError, match="nothing was written"):
        writer.close()
    writer.write(np.zeros((3, 3)), np.zeros(3))
    assert writer.close().num_samples == 3 and writer.close() is writer.store
    with pytest.raises(ShardError, match="closed"):
        writer.write(np.zeros((1, 3)), np.zeros(1))
    # A rewrite removes the old manifest first: an interrupted rewrite never loads as the old store.
    with pytest.raises(RuntimeError):
        with ShardWriter(str(root), shard_size=2) as writer:
            raise RuntimeError
    assert not (root / "manifest.json").exists()


# --- MNIST expanded into a store -----------------------------------------------------------------


def test_augment_mnist_writes_originals_then_distorted_copies(tmp_path):
    images, labels = digits(20)
    store = augment_mnist(images, labels, 67, str(tmp_path / "store"), shard_size=16, seed=0, batch=8)
    assert store.num_samples == 67 and [s["samples"] for s in store.shards] == [16, 16, 16, 16, 3]
    assert store.manifest["x_shape"] == [1, 28, 28] and store.manifest["x_dtype"] == "uint8"
    x, y = store.load(range(store.num_shards))
    assert x.shape == (67, 1, 28, 28) and y.dtype == np.int64
    np.testing.assert_array_equal(x[:20, 0], images)
    np.testing.assert_array_equal(y[:20], labels)
    copies, copy_labels = x[20:, 0], y[20:]
    corr = np.array([correlation(np.repeat(c[None], 20, 0), images) for c in copies])
    assert (corr.max(1) < 0.999).all()  # every copy differs from every source
    assert (labels[corr.argmax(1)] == copy_labels).mean() > 0.75  # and mostly resembles its own kind most
    # Undistorted "copies" show the bookkeeping: each is a source with that source's label, and the 47
    # copies of 20 sources use every source 2 or 3 times (cycled permutations), so classes stay balanced.
    plain = augment_mnist(images, labels, 67, str(tmp_path / "plain"), shard_size=16, seed=0, batch=8,
                          distortion=Distortion.none())
    px, py = plain.load(range(plain.num_shards))
    source = np.array([np.flatnonzero((images == c).all(axis=(1, 2)))[0] for c in px[20:, 0]])
    np.testing.assert_array_equal(labels[source], py[20:])
    uses = np.bincount(source, minlength=20)
    assert uses.min() == 2 and uses.max() == 3 and (uses[source[:40]] >= 2).all()
    assert sorted(source[:20]) == list(range(20)) and sorted(source[20:40]) == list(range(20))


def test_augment_mnist_is_deterministic_for_a_seed_whatever_the_batch_and_shard_size(tmp_path):
    images, labels = digits(10)

    first = augment_mnist(images, labels, 45, str(tmp_path / "a"), shard_size=16, seed=0, batch=8)
    again = augment_mnist(images, labels, 45, str(tmp_path / "b"), shard_size=16, seed=0, batch=8)
    assert [s["md5"] for s in first.shards] == [s["md5"] for s in again.shards]
    x = first.load(range(first.num_shards))
    other_cut = augment_mnist(images, labels, 45, str(tmp_path / "c"), shard_size=7, seed=0, batch=3)
    for got, want in zip(other_cut.load(range(other_cut.num_shards)), x):
        np.testing.assert_array_equal(got, want)
    other_seed = augment_mnist(images, labels, 45, str(tmp_path / "d"), shard_size=16, seed=1, batch=8)
    x1 = other_seed.load(range(other_seed.num_shards))[0]
    np.testing.assert_array_equal(x1[:10], x[0][:10])  # the originals
    assert all((x1[i] != x[0][i]).any() for i in range(10, 45))
    # Without the originals every sample is a distorted copy; with fewer samples than sources only originals.
    copies = augment_mnist(images, labels, 12, str(tmp_path / "e"), seed=0, include_originals=False)
    got = copies.load([0])[0][:, 0]
    assert all(correlation(np.repeat(g[None], 10, 0), images).max() < 0.999 for g in got)
    few = augment_mnist(images, labels, 4, str(tmp_path / "f"), seed=0)
    np.testing.assert_array_equal(few.load([0])[0][:, 0], images[:4])


def test_augment_mnist_command_writes_the_requested_count(tmp_path, caplog):
    from lightning_hybrid.cli.data import data_command

    write_tiny_mnist(tmp_path / "mnist", n_train=50, n_test=10)
    train = read_idx(tmp_path / "mnist" / "train-images-idx3-ubyte.gz")
    caplog.set_level(logging.INFO)
    data_command(["augment-mnist", "--root", str(tmp_path / "mnist"), "--out", str(tmp_path / "store"),
                  "--samples", "130", "--shard-size", "40", "--seed", "1", "--no-verify-md5"])
    store = ShardStore(str(tmp_path / "store"))
    assert store.num_samples == 130 and [s["samples"] for s in store.shards] == [40, 40, 40, 10]
    x, y = store.load(range(4))
    assert x.shape == (130, 1, 28, 28) and x.dtype == np.uint8 and set(y.tolist()) <= set(range(10))
    np.testing.assert_array_equal(x[:50, 0], train)
    progress = [r.getMessage() for r in caplog.records if "augment-mnist:" in r.getMessage()]
    assert len(progress) == 4 and progress[0].startswith("augment-mnist: 40/130 samples") and "samples/s" in progress[0]
    assert "130 samples in 4 shards" in caplog.records[-1].getMessage()

    data_command(["augment-mnist", "--root", str(tmp_path / "mnist"), "--out", str(tmp_path / "copies"),
                  "--samples", "20", "--no-include-originals", "--no-verify-md5"])
    copies = ShardStore(str(tmp_path / "copies"))
    assert copies.num_samples == 20 and copies.num_shards == 1
    assert json.loads((tmp_path / "copies" / "manifest.json").read_text())["shard_size"] == 50000
    with pytest.raises(SystemExit, match="does not hold MNIST's four files"):
        data_command(["augment-mnist", "--root", str(tmp_path), "--out", str(tmp_path / "x"), "--samples", "5"])
    with pytest.raises(SystemExit, match="--samples and --shard-size must be >= 1"):
        data_command(["augment-mnist", "--root", str(tmp_path / "mnist"), "--out", str(tmp_path / "x"),
                      "--samples", "0", "--no-verify-md5"])


def test_real_mnist_distortions_keep_digits_recognizable(tmp_path, real_mnist):
    images = read_idx(real_mnist / "train-images-idx3-ubyte.gz")
    labels = read_idx(real_mnist / "train-labels-idx1-ubyte.gz")
    train, train_labels = images[:5000], labels[:5000]
    held, held_labels = images[5000:5600], labels[5000:5600]
    out = distort(held, seed=0)
    corr = correlation(held, out)
    assert 0.45 < corr.mean() < 0.75 and (corr < 0.999).mean() > 0.99
    ratio = ink(out) / ink(held)
    assert 0.9 < ratio.mean() < 1.1 and np.median(np.abs(ratio - 1)) < 0.2

    def nearest_neighbour_accuracy(queries: np.ndarray) -> float:
        a = train.reshape(len(train), -1).astype(np.float32)
        q = queries.reshape(len(queries), -1).astype(np.float32)
        d = (q * q).sum(1)[:, None] - 2 * q @ a.T + (a * a).sum(1)[None]
        return float((train_labels[d.argmin(1)] == held_labels).mean())

    # A 1-NN classifier in pixel space is very sensitive to deformation, yet still mostly right.
    assert nearest_neighbour_accuracy(held) > 0.9
    assert nearest_neighbour_accuracy(out) > 0.55
    assert nearest_neighbour_accuracy(distort(held, seed=0, distortion=Distortion(alpha=0))) > 0.8

    store = augment_mnist(images[:1000], labels[:1000], 2500, str(tmp_path / "store"), shard_size=1000)
    x, y = store.load(range(store.num_shards))
    assert x.shape == (2500, 1, 28, 28) and np.bincount(y, minlength=10).min() > 150
