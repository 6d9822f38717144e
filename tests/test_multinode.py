"""Two nodes on one machine: `torchrun --nnodes 2` launched twice (one launcher per node, as on a
cluster), each starting one rank; the parameter server is reached through the rendezvous."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REFERENCE, TRAIN_SCRIPT, shared_train_script

pytestmark = pytest.mark.multiprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_launchers(out: Path, *args: str, timeout: float = 240) -> None:
    """``torchrun --nnodes 2 --nproc-per-node 1 --node-rank {0,1}`` of tests/train_script.py."""
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_PORT", "NODE_RANK")}
    launchers = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank",
             str(node), "--master-addr", "127.0.0.1", "--master-port", str(port), str(TRAIN_SCRIPT), str(out), *args,
             "--devices", "1", "--num-nodes", "2"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for node in (0, 1)
    ]
    outputs = []
    for launcher in launchers:
        try:
            outputs.append(launcher.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for other in launchers:
                other.kill()
            pytest.fail(f"torchrun timed out after {timeout} s")
    for node, (launcher, output) in enumerate(zip(launchers, outputs)):
        assert launcher.returncode == 0, f"node {node}'s torchrun exited {launcher.returncode}:\n{output[-5000:]}"


def check_equal(run: Path, reference: Path) -> None:
    expected = torch.load(reference / "rank0.pt", weights_only=False)
    ranks = [torch.load(run / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    for name, value in expected.items():
        torch.testing.assert_close(ranks[0][name], ranks[1][name], rtol=0, atol=0, msg=f"nodes disagree on {name}")
        torch.testing.assert_close(ranks[0][name], value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "strategy", [("--strategy", "ssp", "--staleness", "0"), ("--strategy", "asgd", "--delay", "0")], ids=["ssp", "allreduce_asgd"]
)
def test_two_torchrun_launchers_equal_one_node_ddp(tmp_path, tmp_path_factory, strategy):
    """At staleness 0 / delay 0 both strategies equal DDP: on two nodes as on one."""
    assert REFERENCE[:2] == ("--devices", "2")  # one node of two ranks, split into two nodes of one rank
    ddp = shared_train_script(tmp_path_factory, "--strategy", "ddp", *REFERENCE)
    two_launchers(tmp_path, *strategy, *REFERENCE[2:])
    check_equal(tmp_path, ddp)
