"""Two-process DDP on CPU through a plain `Trainer(strategy="ddp")` script, checked against one process."""

from __future__ import annotations

import pytest
import torch

from conftest import run_train_script


@pytest.mark.multiprocess
def test_two_process_ddp_equals_single_process_on_the_global_batch(tmp_path):
    # 2 ranks x 16 samples: DistributedSampler deals rank r every other sample of the epoch's seeded
    # permutation, so each step averages the gradient of the same 32 samples that one process with
    # batch 32 and EpochSeededRandomSampler sees.
    run_train_script(tmp_path / "ddp", "--strategy", "ddp", "--devices", "2", "--batch-size", "16")
    run_train_script(tmp_path / "single", "--strategy", "auto", "--devices", "1", "--batch-size", "32")
    rank0 = torch.load(tmp_path / "ddp" / "rank0.pt")
    rank1 = torch.load(tmp_path / "ddp" / "rank1.pt")
    single = torch.load(tmp_path / "single" / "rank0.pt")
    for name in single:
        torch.testing.assert_close(rank0[name], rank1[name], rtol=0, atol=0, msg=f"ranks disagree on {name}")
        torch.testing.assert_close(rank0[name], single[name], rtol=1e-5, atol=1e-6, msg=f"DDP != single on {name}")
    assert float((tmp_path / "ddp" / "test_acc.txt").read_text()) > 0.9
