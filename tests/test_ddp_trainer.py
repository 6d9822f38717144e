"""Two-process DDP on CPU through a plain `Trainer(strategy="ddp")` script, checked against one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).with_name("ddp_script.py")


def run_script(out: Path, strategy: str, devices: int, batch_size: int) -> None:
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "MASTER_PORT", "WORLD_SIZE")}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), strategy, str(devices), str(batch_size)],
        env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.multiprocess
def test_two_process_ddp_equals_single_process_on_the_global_batch(tmp_path):
    # 2 ranks x 16 samples: DistributedSampler deals rank r every other sample of the epoch's seeded
    # permutation, so each step averages the gradient of the same 32 samples that one process with
    # batch 32 and EpochSeededRandomSampler sees.
    run_script(tmp_path / "ddp", "ddp", 2, 16)
    run_script(tmp_path / "single", "auto", 1, 32)
    rank0 = torch.load(tmp_path / "ddp" / "rank0.pt")
    rank1 = torch.load(tmp_path / "ddp" / "rank1.pt")
    single = torch.load(tmp_path / "single" / "rank0.pt")
    initial_changed = False
    for name in single:
        torch.testing.assert_close(rank0[name], rank1[name], rtol=0, atol=0, msg=f"ranks disagree on {name}")
        torch.testing.assert_close(rank0[name], single[name], rtol=1e-5, atol=1e-6, msg=f"DDP != single on {name}")
        initial_changed |= name.endswith("weight")
    assert initial_changed
    assert float((tmp_path / "ddp" / "test_acc.txt").read_text()) > 0.9
