"""Shared fixtures: tiny generated MNIST files, the real MNIST folder when present, and a CLI runner."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lightning_hybrid.data.idx import write_idx

REPO = Path(__file__).resolve().parents[1]
REAL_MNIST = REPO.parent / "shared" / "data" / "mnist"


@pytest.fixture
def real_mnist() -> Path:
    """The real MNIST files of ../shared/data/mnist; the test is skipped when they are absent."""
    if not (REAL_MNIST / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST files not found in {REAL_MNIST} (a fresh clone has no ../shared); skipping")
    return REAL_MNIST


def write_tiny_mnist(folder: Path, n_train: int = 120, n_test: int = 40, seed: int = 0) -> dict[str, str]:
    """Write the four MNIST files with ``n_train``/``n_test`` random 28x28 images; return their md5s."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train-images-idx3-ubyte.gz": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte.gz": (np.arange(n_train) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte.gz": (np.arange(n_test) % 10).astype(np.uint8),
    }
    for name, array in arrays.items():
        write_idx(folder / name, array)
    return {name: hashlib.md5((folder / name).read_bytes()).hexdigest() for name in arrays}


@pytest.fixture
def tiny_mnist(tmp_path: Path) -> Path:
    folder = tmp_path / "mnist"
    write_tiny_mnist(folder)
    return folder


TRAIN_SCRIPT = Path(__file__).with_name("train_script.py")


def run_train_script(out: Path, *args: str, timeout: float = 240, check: bool = True) -> subprocess.CompletedProcess:
    """Run tests/train_script.py (a user's script with its own Trainer) writing into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK")}
    proc = subprocess.run(
        [sys.executable, str(TRAIN_SCRIPT), str(out), *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        pytest.fail(f"train_script.py {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-6000:]}")
    return proc


def run_cli(*overrides: str, cwd: Path, timeout: float = 240, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -m lightning_hybrid.cli`` with overrides in ``cwd``; fail the test on timeout."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_hybrid.cli", *overrides, "trainer.enable_progress_bar=false"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )
    if check and proc.returncode != 0:
        pytest.fail(f"lightning-hybrid {' '.join(overrides)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc
