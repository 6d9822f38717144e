"""IDX parsing of tiny generated files, including corrupt, truncated and md5-mismatched ones."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from lightning_hybrid.data.idx import DataFileError, md5sum, parse_idx, read_idx, write_idx


@pytest.mark.parametrize("suffix", [".gz", ""])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
def test_round_trip(tmp_path, suffix, dtype):
    array = (np.arange(2 * 3 * 4) - 5).astype(dtype).reshape(2, 3, 4)
    path = tmp_path / f"a-idx3{suffix}"
    write_idx(path, array)
    back = read_idx(path)
    assert back.dtype == np.dtype(dtype) and back.shape == (2, 3, 4)
    np.testing.assert_array_equal(back, array)


def test_header_is_big_endian_idx(tmp_path):
    path = tmp_path / "labels-idx1-ubyte"
    write_idx(path, np.array([7, 2, 1], dtype=np.uint8))
    assert path.read_bytes() == bytes([0, 0, 0x08, 1, 0, 0, 0, 3, 7, 2, 1])


def test_truncated_data_names_file(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte.gz"
    write_idx(path, np.zeros((5, 28, 28), dtype=np.uint8))
    raw = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(raw[:-100]))
    with pytest.raises(DataFileError, match=r"train-images-idx3-ubyte\.gz: truncated IDX file"):
        read_idx(path)


def test_truncated_header(tmp_path):
    with pytest.raises(DataFileError, match="x.idx: truncated"):
        parse_idx(bytes([0, 0, 8, 3, 0, 0]), name="x.idx")
    with pytest.raises(DataFileError, match="no complete header"):
        parse_idx(b"\x00\x00", name="x.idx")


def test_truncated_gzip_names_file(tmp_path):
    path = tmp_path / "t10k-labels-idx1-ubyte.gz"
    write_idx(path, np.arange(100, dtype=np.uint8))
    path.write_bytes(path.read_bytes()[:-12])
    with pytest.raises(DataFileError, match=r"t10k-labels-idx1-ubyte\.gz: corrupt or truncated gzip"):
        read_idx(path)


def test_not_gzip_names_file(tmp_path):
    path = tmp_path / "train-labels-idx1-ubyte.gz"
    path.write_bytes(b"<html>404 not found</html>")
    with pytest.raises(DataFileError, match=r"train-labels-idx1-ubyte\.gz: corrupt or truncated gzip"):
        read_idx(path)


def test_bad_magic_names_file(tmp_path):
    path = tmp_path / "bad.gz"
    path.write_bytes(gzip.compress(b"\x12\x34\x08\x01\x00\x00\x00\x01\x05"))
    with pytest.raises(DataFileError, match=r"bad\.gz: not an IDX file"):
        read_idx(path)


def test_trailing_bytes_are_corruption(tmp_path):
    with pytest.raises(DataFileError, match="beyond the declared shape"):
        parse_idx(bytes([0, 0, 8, 1, 0, 0, 0, 1, 5, 6]), name="x")


def test_md5_mismatch_names_file_and_digests(tmp_path):
    path = tmp_path / "train-labels-idx1-ubyte.gz"
    write_idx(path, np.arange(10, dtype=np.uint8))
    good = md5sum(path)
    np.testing.assert_array_equal(read_idx(path, md5=good), np.arange(10))
    with pytest.raises(DataFileError) as err:
        read_idx(path, md5="0" * 32)
    message = str(err.value)
    assert "train-labels-idx1-ubyte.gz" in message and "md5 mismatch" in message and good in message


def test_missing_file(tmp_path):
    with pytest.raises(DataFileError, match="no such file"):
        read_idx(tmp_path / "nope.gz")
