"""Atomic checkpoint saves: a write that fails half-way (the kernel refusing to grow the file, as a
full disk does) leaves neither a partial checkpoint nor a temporary file, and an older checkpoint
of the same name intact."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from conftest import Zygote, clean_env
from lightning_hybrid import DelayedAveragingStrategy, BalancedDataParallelStrategy, CNeuralStrategy, SSPStrategy
from lightning_hybrid.strategies.checkpoint_io import AtomicCheckpointIO

SAVE_UNDER_A_FILE_SIZE_LIMIT = textwrap.dedent(
    """
    import resource, signal, sys
    import torch
    from lightning_hybrid.strategies.checkpoint_io import AtomicCheckpointIO
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(100_000)}}, sys.argv[1])
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
def test_a_failed_save_leaves_no_partial_checkpoint(tmp_path):
    target = tmp_path / "checkpoints" / "epoch001.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.zeros(3)}}, target)  # an earlier good save
    (tmp_path / "save.py").write_text(SAVE_UNDER_A_FILE_SIZE_LIMIT)
    # a process of its own (the file size limit is the process's), forked from the tests' pre-imported Python
    proc = Zygote.run([str(tmp_path / "save.py"), str(target)], clean_env(), tmp_path, timeout=120)
    assert proc.returncode != 0 and "File too large" in proc.stderr, proc.stderr[-2000:]
    assert sorted(p.name for p in target.parent.iterdir()) == ["epoch001.ckpt"], "no temporary file left behind"
    kept = torch.load(target, weights_only=True)
    torch.testing.assert_close(kept["state_dict"]["w"], torch.zeros(3))


def test_a_save_round_trips_and_the_strategies_use_it(tmp_path):
    io = AtomicCheckpointIO()
    io.save_checkpoint({"state_dict": {"w": torch.arange(4.0)}, "epoch": 2}, tmp_path / "sub" / "last.ckpt")
    loaded = io.load_checkpoint(tmp_path / "sub" / "last.ckpt")
    assert loaded["epoch"] == 2 and torch.equal(loaded["state_dict"]["w"], torch.arange(4.0))
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["last.ckpt"]
    for strategy in (SSPStrategy(), CNeuralStrategy(), DelayedAveragingStrategy(), BalancedDataParallelStrategy(global_batch=64)):
        assert isinstance(strategy.checkpoint_io, AtomicCheckpointIO), type(strategy).__name__
