"""Two-process DDP on CPU through a plain `Trainer(strategy="ddp")` script, checked against one process."""

from __future__ import annotations

import pytest
import torch

from conftest import REFERENCE, run_train_script, shared_train_script


@pytest.mark.multiprocess
def test_two_process_ddp_equals_single_process_on_the_global_batch(tmp_path, tmp_path_factory):
    # 2 ranks x 16 samples: DistributedSampler deals rank r every other sample of the epoch's seeded
    # permutation, so each step averages the gradient of the same 32 samples that one process with
    # batch 32 and EpochSeededRandomSampler sees.
    ddp = shared_train_script(tmp_path_factory, "--strategy", "ddp", *REFERENCE)
    run_train_script(tmp_path / "single", "--strategy", "auto", *REFERENCE, "--devices", "1", "--batch-size", "32")
    rank0 = torch.load(ddp / "rank0.pt")
    rank1 = torch.load(ddp / "rank1.pt")
    single = torch.load(tmp_path / "single" / "rank0.pt")
    for name in single:
        torch.testing.assert_close(rank0[name], rank1[name], rtol=0, atol=0, msg=f"ranks disagree on {name}")
        torch.testing.assert_close(rank0[name], single[name], rtol=1e-5, atol=1e-6, msg=f"DDP != single on {name}")
    assert float((ddp / "test_acc.txt").read_text()) > 0.9
