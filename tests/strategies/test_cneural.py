"""cNeural (paper 002): resident shards per worker, batch-mode master-worker training, crash recovery."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F

from conftest import Zygote, alive, clean_env, run_cli, run_train_script, shared_train_script
from lightning_hybrid import CNeuralStrategy, SSPStrategy
from lightning_hybrid.data import ShardDataModule, ShardError, pack
from lightning_hybrid.models import MLP
from lightning_hybrid.parameter_server.server_process import PROCESS_NAME
from lightning_hybrid.run_folder import newest_checkpoint

MEAN, STD = 0.1307, 0.3081


def digits(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """uint8 28x28 images: a fixed template per class plus noise (learnable, not trivially)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, n)
    templates = np.random.default_rng(99).random((10, 1, 28, 28))
    x = np.clip(templates[y] * 200 + rng.normal(0, 60, (n, 1, 28, 28)), 0, 255).astype(np.uint8)
    return x, y.astype(np.int64)


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("stores")
    pack(*digits(2000, 1), str(root / "train"), shard_size=250)
    pack(*digits(200, 2), str(root / "test"), shard_size=100)
    return {"train": str(root / "train"), "test": str(root / "test")}


# ---------------------------------------------------------------------- the datamodule, in one process
def test_each_worker_holds_its_own_shards_once(stores):
    x_all, y_all = digits(2000, 1)
    seen = []
    for rank in range(3):
        dm = ShardDataModule(stores["train"], quota="1MiB", mean=MEAN, std=STD)
        share = dm.load_share(rank, 3)
        assert dm.load_seconds is not None and dm.load_seconds >= 0
        assert share.x.dtype == torch.uint8  # resident in the stored dtype
        seen.append(share.x.reshape(len(share), -1).numpy())
    together = np.concatenate(seen)
    assert len(together) == 2000
    # Every sample exactly once across the workers (as a multiset of images).
    assert sorted(map(bytes, together)) == sorted(map(bytes, x_all.reshape(2000, -1)))


def test_reading_a_lost_workers_share_leaves_the_own_share_alone(stores):
    dm = ShardDataModule(stores["train"], quota="1MiB", mean=MEAN, std=STD)
    own = dm.load_share(0, 3)
    theirs = dm.read_share(1, 3)  # what worker 0 reads when it takes over worker 1's share
    assert torch.equal(theirs.x, ShardDataModule(stores["train"], quota="1MiB").load_share(1, 3).x)
    assert not torch.equal(theirs.x[:10], own.x[:10])
    assert dm._share == (0, 3)  # its own share is still shard set 0 of 3


def test_batches_are_converted_and_normalized(stores):
    dm = ShardDataModule(stores["train"], quota="2MiB", mean=MEAN, std=STD, batch_size=64)
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (64, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    raw = dm.train_set.x[:3].float() / 255
    assert torch.allclose(dm.train_set[0][0], (raw[0] - MEAN) / STD)
    assert dm.logical_workers == min(os.cpu_count(), (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // 2**21)


def test_quota_and_worker_errors(stores):
    with pytest.raises(ShardError, match="smaller than one shard"):
        ShardDataModule(stores["train"], quota="100KiB").load_share(0, 2)
    with pytest.raises(ShardError, match="too big for the quota"):
        ShardDataModule(stores["train"], quota="400KiB").load_share(0, 2)  # 4 shards of ~196 KiB each
    with pytest.raises(ShardError, match="8 shards for 9 workers"):
        ShardDataModule(stores["train"], quota="10MiB").load_share(0, 9)
    with pytest.raises(ValueError, match="quota must be positive"):
        ShardDataModule(stores["train"], quota=0)
    dm = ShardDataModule(stores["train"], quota="10MiB", resident=False)
    dm.trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    with pytest.raises(ValueError, match="reload_dataloaders_every_n_epochs=1"):
        dm.setup("fit")


def test_not_resident_rereads_the_store_every_epoch(stores, tmp_path):
    dm = ShardDataModule(stores["train"], quota="10MiB", resident=False)
    dm.setup("fit")
    first = dm.train_set
    dm.train_dataloader()
    assert dm.train_set is first  # the first epoch uses what setup loaded
    dm.train_dataloader()
    assert dm.train_set is not first and torch.equal(dm.train_set.x, first.x)


def test_batch_mode_strategy_api():
    assert "cneural" in pl.strategies.StrategyRegistry
    with pytest.warns(DeprecationWarning, match="use CNeuralStrategy"):
        strategy = SSPStrategy(batch_mode=True, staleness=5)
    assert isinstance(strategy, CNeuralStrategy)
    assert strategy.batch_mode and strategy.staleness == 0  # one bulk-synchronous round per pass
    trainer = pl.Trainer(accelerator="cpu", devices=1, strategy=strategy, logger=False, limit_train_batches=0.5)
    strategy.check_trainer(trainer, None)  # one worker and fractional limits are fine in batch mode
    with pytest.raises(ValueError, match="at least two workers"):
        SSPStrategy().check_trainer(pl.Trainer(accelerator="cpu", devices=1, strategy=SSPStrategy(), logger=False), None)


# ---------------------------------------------------------------------- batch mode + crash recovery, real processes
def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, name) of the live child processes of ``pid`` (Linux /proc: the parameter server names
    itself ``lh-param-server``; forked ranks keep the name of the process they were forked from)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            name = (entry / "comm").read_text().strip()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            found.append((int(entry.name), name))
    return found


def _full_batch_reference(checkpoint: dict, x: np.ndarray, y: np.ndarray, epochs: int) -> dict[str, torch.Tensor]:
    """Plain one-process full-batch gradient descent from a checkpoint's parameters and momentum."""
    net = MLP(hidden=(16,))
    net.load_state_dict({k.removeprefix("net."): v for k, v in checkpoint["state_dict"].items()})
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.9)
    optimizer.load_state_dict(checkpoint["optimizer_states"][0])
    inputs = (torch.from_numpy(x).float() / 255 - MEAN) / STD
    for _ in range(epochs):
        optimizer.zero_grad()
        F.cross_entropy(net(inputs), torch.from_numpy(y)).backward()
        optimizer.step()
    return {f"net.{k}": v for k, v in net.state_dict().items()}


@pytest.mark.multiprocess
@pytest.mark.parametrize("victim", ["worker", "master"])
def test_a_killed_run_resumes_from_its_last_epoch_and_loses_nothing(stores, tmp_path, victim):
    """Batch mode equals full-batch gradient descent, and after SIGKILL of a worker (or of the
    parameter server) the same command resumes from the last completed epoch's saved parameters
    and optimizer state: the final parameters are those of an uninterrupted run."""
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "lightning_hybrid.cli", "experiment=gu2013_cneural", "strategy.fork_ranks=true",
        f"data.train_store={stores['train']}", f"data.val_store={stores['test']}", "data.test_store=null",
        "data.batch_size=100", "model.hidden=[16]", "trainer.devices=2", "trainer.max_epochs=8", "test=false",
        "strategy.timeout=60", f"hydra.run.dir={run_dir}", "trainer.enable_progress_bar=false",
    ]
    env = clean_env(PYTHONWARNINGS="ignore")
    last = run_dir / "checkpoints" / "last.ckpt"
    first = Zygote.start(command[1:], env, tmp_path, tmp_path / "first.log", tmp_path / "first.log")
    deadline = time.monotonic() + 180
    epoch1 = run_dir / "checkpoints" / "epoch001.ckpt"

    def last_holds_epoch1() -> bool:  # last.ckpt is written (renamed into place) after epoch001.ckpt
        return epoch1.exists() and last.exists() and last.stat().st_mtime_ns >= epoch1.stat().st_mtime_ns

    while not last_holds_epoch1():
        assert first.poll() is None, f"the run ended before its second epoch:\n{(tmp_path / 'first.log').read_text()[-4000:]}"
        assert time.monotonic() < deadline, "no checkpoint of epoch 1 within 180 s"
        time.sleep(0.05)
    children = _children(first.pid)
    server = [pid for pid, name in children if name == PROCESS_NAME]
    (target,) = [pid for pid, name in children if (name == PROCESS_NAME) == (victim == "master")]
    os.kill(target, signal.SIGSTOP)  # frozen mid-run: no further epoch can complete without it
    os.kill(target, signal.SIGKILL)
    try:
        code = first.wait(timeout=120)
    except subprocess.TimeoutExpired:
        first.kill()
        pytest.fail(f"the run hung after its {victim} was killed:\n{(tmp_path / 'first.log').read_text()[-4000:]}")
    assert code != 0
    deadline = time.monotonic() + 30
    while server and alive(server[0]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (server and alive(server[0])), "the parameter server outlived its run"

    # what ckpt_path=auto resumes: the newest checkpoint (an epoch's may be written, last.ckpt not yet renamed over)
    saved = torch.load(newest_checkpoint(run_dir), map_location="cpu", weights_only=False)
    completed = saved["epoch"]  # the last epoch completed before the crash
    assert 1 <= completed < 7

    second = Zygote.run(command[1:], env, tmp_path, timeout=240)
    assert second.returncode == 0, second.stderr[-5000:]
    assert "Restoring states from the checkpoint path" in second.stdout + second.stderr
    final = torch.load(last, map_location="cpu", weights_only=False)
    assert final["epoch"] == 7
    expected = _full_batch_reference(saved, *digits(2000, 1), epochs=7 - completed)
    for name, value in expected.items():
        torch.testing.assert_close(final["state_dict"][name], value, rtol=1e-5, atol=1e-6, msg=name)
    # The epochs before the crash were not redone: the rerun logged only the epochs after it.
    csv = sorted(run_dir.glob("**/metrics.csv"))[-1].read_text().splitlines()
    epoch_column = csv[0].split(",").index("epoch")
    logged = {int(float(row.split(",")[epoch_column])) for row in csv[1:] if row.split(",")[epoch_column]}
    assert min(logged) == completed + 1


@pytest.mark.multiprocess
def test_validation_inside_a_pass_sees_the_pass_parameters_and_changes_nothing(tmp_path, tmp_path_factory):
    """val_check_interval=0.5: each pass is validated halfway (at the parameters the pass started
    with, the same on both workers) and after its update; the updates are those of a run that
    validates only at epoch ends."""
    setting = ("--strategy", "cneural", "--epochs", "2", "--lr", "0.5", "--samples", "256")
    run_train_script(tmp_path, *setting, "--val-check-interval", "0.5")
    records = [torch.load(tmp_path / f"validations_rank{r}.pt") for r in (0, 1)]
    assert [epoch for epoch, _ in records[0]] == [0, 0, 1, 1] == [epoch for epoch, _ in records[1]]
    for (_, mine), (_, theirs) in zip(*records):
        assert torch.equal(mine, theirs)
    params = [p for _, p in records[0]]  # halfway through pass 0, after it, halfway through pass 1, after it
    assert torch.equal(params[1], params[2])  # nothing changes inside a pass
    assert not torch.equal(params[0], params[1]) and not torch.equal(params[2], params[3])  # one update per pass
    reference = shared_train_script(tmp_path_factory, *setting)
    final, expected = torch.load(tmp_path / "rank0.pt"), torch.load(reference / "rank0.pt")
    for name, value in expected.items():
        torch.testing.assert_close(final[name], value, rtol=0, atol=0, msg=name)


def test_validation_inside_a_pass_needs_shares_of_equal_length(stores, tmp_path):
    """8 shards over 3 workers are shares of 3, 3 and 2 shards: the workers would reach a halfway
    validation at different batches, which is refused with the numbers."""
    proc = run_cli(
        "experiment=gu2013_cneural", "strategy.fork_ranks=true", f"data.train_store={stores['train']}",
        f"data.val_store={stores['test']}", "data.test_store=null", "data.batch_size=50", "model.hidden=[16]",
        "trainer.devices=3", "allow_cpu_oversubscription=true", "trainer.max_epochs=1", "+trainer.val_check_interval=0.5",
        "test=false",
        "strategy.timeout=30", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, check=False, timeout=120,
    )
    assert proc.returncode != 0
    assert "the workers' shares have [15, 15, 10] batches" in proc.stderr, proc.stderr[-3000:]


def test_epoch_scheduler_sets_the_rate_of_the_pass_it_steps_after(tmp_path):
    """Lightning steps an epoch-interval scheduler after a pass's last batch, before the pass's update
    is pushed; the update must still use the rate in force during the pass (LR / 2**epoch here)."""
    from lightning_hybrid.data.synthetic_mnist import synthetic_classification

    epochs, lr = 3, 0.5
    run_train_script(tmp_path, "--strategy", "cneural", "--scheduler", "--lr", str(lr), "--epochs", str(epochs))
    pl.seed_everything(0)  # as tests/support/train_script.py: the same initial weights
    net = MLP(activation="relu")
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    x, y = synthetic_classification(256, (1, 28, 28), 10, seed=1)
    for epoch in range(epochs):  # full-batch gradient descent, one step per pass at that epoch's rate
        optimizer.param_groups[0]["lr"] = lr / 2**epoch
        optimizer.zero_grad()
        F.cross_entropy(net(x), y).backward()
        optimizer.step()
    result = torch.load(tmp_path / "rank0.pt", weights_only=False)
    for name, value in net.state_dict().items():
        torch.testing.assert_close(result[f"net.{name}"], value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.multiprocess
def test_a_step_is_a_pass(tmp_path):
    """trainer.global_step counts passes (the updates the model receives), max_steps=3 is three passes,
    and a step-interval scheduler steps once per pass: each pass is applied at LR / 2**pass, the rate
    in force during it, as full-batch gradient descent with that schedule."""
    from lightning_hybrid.data.synthetic_mnist import synthetic_classification

    passes, lr = 3, 0.5
    run_train_script(tmp_path, "--strategy", "cneural", "--step-scheduler", "--lr", str(lr), "--epochs", "10",
                     "--max-steps", str(passes))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["global_step"] == passes and summary["lr"] == pytest.approx(lr / 2**passes), summary
    history = json.loads((tmp_path / "ssp_history.json").read_text())
    assert len(history) == passes  # one epoch per pass
    pl.seed_everything(0)  # as tests/support/train_script.py: the same initial weights
    net = MLP(activation="relu")
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    x, y = synthetic_classification(256, (1, 28, 28), 10, seed=1)
    for k in range(passes):
        optimizer.param_groups[0]["lr"] = lr / 2**k
        optimizer.zero_grad()
        F.cross_entropy(net(x), y).backward()
        optimizer.step()
    result = torch.load(tmp_path / "rank0.pt", weights_only=False)
    for name, value in net.state_dict().items():
        torch.testing.assert_close(result[f"net.{name}"], value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.multiprocess
def test_two_server_shards_take_the_same_passes_as_one_server(tmp_path, tmp_path_factory):
    """``servers=2``: each shard averages its slice of every worker's pass sum, exactly as one server
    does for the whole vector (a pass is one bulk-synchronous round)."""
    setting = ("--strategy", "cneural", "--epochs", "2", "--lr", "0.5", "--samples", "256")
    run_train_script(tmp_path, *setting, "--servers", "2")
    assert (tmp_path / "pid_server1").exists(), "a second server shard was started"
    reference = shared_train_script(tmp_path_factory, *setting)
    for rank in (0, 1):
        final, expected = torch.load(tmp_path / f"rank{rank}.pt"), torch.load(reference / "rank0.pt")
        for name, value in expected.items():
            torch.testing.assert_close(final[name], value, rtol=0, atol=0, msg=name)
