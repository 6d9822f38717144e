"""MNISTDataModule: layouts, checksums, deterministic splits, download and the offline error."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading

import numpy as np
import pytest
import torch

from conftest import write_tiny_mnist
from lightning_hybrid.data import MNIST_FILES, DataFileError, MNISTDataModule, MNISTNotFoundError


def labels_of(dataset) -> np.ndarray:
    return dataset.tensors[1].numpy()


def test_flat_folder(tiny_mnist):
    dm = MNISTDataModule(tiny_mnist, batch_size=16, val_fraction=0.25, verify_md5=False, download=False)
    dm.prepare_data()
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (90, 30, 40)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64


def test_torchvision_layout(tmp_path):
    write_tiny_mnist(tmp_path / "MNIST" / "raw")
    dm = MNISTDataModule(tmp_path, verify_md5=False, download=False)
    dm.setup()
    assert len(dm.test_set) == 40


def test_split_is_deterministic_by_seed(tiny_mnist):
    def split(seed):
        dm = MNISTDataModule(tiny_mnist, val_fraction=0.25, seed=seed, verify_md5=False, download=False)
        dm.setup()
        return dm.train_set.tensors[0], dm.val_set.tensors[0]

    a_train, a_val = split(0)
    b_train, b_val = split(0)
    c_train, c_val = split(1)
    assert torch.equal(a_train, b_train) and torch.equal(a_val, b_val)
    assert not torch.equal(a_val, c_val)
    # train and validation are disjoint and together the whole training file
    assert len(a_train) + len(a_val) == 120
    rows = {bytes(r.numpy().tobytes()) for r in torch.cat([a_train, a_val])}
    assert len(rows) == 120


def test_subset(tiny_mnist):
    dm = MNISTDataModule(tiny_mnist, val_fraction=0.1, subset=50, verify_md5=False, download=False)
    dm.setup()
    assert len(dm.train_set) + len(dm.val_set) == 50 and len(dm.test_set) == 40


def test_md5_mismatch_names_the_file(tiny_mnist):
    dm = MNISTDataModule(tiny_mnist, download=False)  # tiny files are not the real release
    with pytest.raises(DataFileError, match=r"train-images-idx3-ubyte\.gz: md5 mismatch"):
        dm.setup()


def test_corrupt_file_names_the_file(tiny_mnist):
    (tiny_mnist / "t10k-images-idx3-ubyte.gz").write_bytes(b"garbage")
    dm = MNISTDataModule(tiny_mnist, verify_md5=False, download=False)
    with pytest.raises(DataFileError, match=r"t10k-images-idx3-ubyte\.gz"):
        dm.setup()


def test_offline_error_names_folder_files_and_synthetic(tmp_path):
    # Port 9 on loopback refuses at once: the same code path as a machine without internet.
    dm = MNISTDataModule(tmp_path / "empty", mirrors=["http://127.0.0.1:9/"])
    with pytest.raises(MNISTNotFoundError) as err:
        dm.prepare_data()
    message = str(err.value)
    assert str((tmp_path / "empty").resolve()) in message
    assert all(name in message for name in MNIST_FILES)
    assert "data=synthetic" in message and "127.0.0.1:9" in message
    assert not any((tmp_path / "empty").glob("*.part")), "a failed download must not leave partial files"


def test_download_false_missing_folder(tmp_path):
    with pytest.raises(MNISTNotFoundError, match="download=False"):
        MNISTDataModule(tmp_path / "nowhere", download=False).prepare_data()


@pytest.fixture
def http_mirror(tmp_path):
    """A real HTTP server on loopback serving tiny MNIST files."""
    served = tmp_path / "served"
    write_tiny_mnist(served)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_download_from_mirror(tmp_path, http_mirror):
    root = tmp_path / "downloaded"
    dm = MNISTDataModule(root, verify_md5=False, mirrors=["http://127.0.0.1:9/", http_mirror])
    dm.prepare_data()  # the first mirror fails, the second serves
    assert sorted(p.name for p in root.iterdir()) == sorted(MNIST_FILES)
    dm.setup()
    assert len(dm.test_set) == 40
    np.testing.assert_array_equal(labels_of(dm.test_set), np.arange(40) % 10)


def test_download_completes_partial_folder(tmp_path, http_mirror):
    root = tmp_path / "partial"
    write_tiny_mnist(root)
    (root / "t10k-labels-idx1-ubyte.gz").unlink()
    MNISTDataModule(root, verify_md5=False, mirrors=[http_mirror]).prepare_data()
    assert (root / "t10k-labels-idx1-ubyte.gz").is_file()


def test_real_mnist(real_mnist, tmp_path):
    # A torchvision-style copy of the real files must be found and pass its md5 check.
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in MNIST_FILES:
        shutil.copy(real_mnist / name, raw / name)
    dm = MNISTDataModule(tmp_path, download=False)
    dm.setup()
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (55000, 5000, 10000)
    assert labels_of(dm.test_set)[:3].tolist() == [7, 2, 1]  # the first three test digits
    x = dm.train_set.tensors[0]
    assert abs(float(x.mean())) < 0.05 and abs(float(x.std()) - 1.0) < 0.05
