"""Two nodes on one machine: `torchrun --nnodes 2` launched twice (one launcher per node, as on a
cluster), each starting one rank, and two processes given the variables SLURM's `srun` sets (Lightning's
SLURMEnvironment); the parameter server is reached through the rendezvous."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REFERENCE, TRAIN_SCRIPT, Zygote, free_port, shared_train_script

pytestmark = pytest.mark.multiprocess


def two_launchers(out: Path, *args: str, launcher: str = "torchrun", timeout: float = 240) -> None:
    """tests/support/train_script.py on two one-rank nodes: ``torchrun --nnodes 2 --nproc-per-node 1
    --node-rank {0,1}``, or (``launcher="slurm"``) two processes with the variables ``srun -N 2 -n 2``
    gives its tasks (each forked from the tests' pre-imported Python, tests/support/zygote.py, as SLURM's tasks
    are no children of each other)."""
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_PORT", "NODE_RANK") and not k.startswith("SLURM_")}
    script = [str(TRAIN_SCRIPT), str(out), *args, "--devices", "1", "--num-nodes", "2"]
    logs = [out / f"node{node}.log" for node in (0, 1)]
    processes = []
    for node in (0, 1):
        if launcher == "torchrun":
            command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                       "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port), *script]
            with logs[node].open("w") as log:
                processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
        else:
            processes.append(Zygote.start(script, {
                **env, "SLURM_NTASKS": "2", "SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "1", "SLURM_PROCID": str(node),
                "SLURM_LOCALID": "0", "SLURM_NODEID": str(node), "SLURM_NODELIST": "127.0.0.1", "SLURM_JOB_ID": "4242",
                "SLURM_JOB_NAME": "two_nodes", "MASTER_PORT": str(port)}, Path.cwd(), logs[node], logs[node]))
    for process in processes:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            pytest.fail(f"{launcher} launch timed out after {timeout} s")
    for node, (process, log) in enumerate(zip(processes, logs)):
        assert process.returncode == 0, f"node {node} exited {process.returncode}:\n{log.read_text()[-5000:]}"


def check_equal(run: Path, reference: Path) -> None:
    expected = torch.load(reference / "rank0.pt", weights_only=False)
    ranks = [torch.load(run / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    for name, value in expected.items():
        torch.testing.assert_close(ranks[0][name], ranks[1][name], rtol=0, atol=0, msg=f"nodes disagree on {name}")
        torch.testing.assert_close(ranks[0][name], value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "strategy, launcher",
    # each launcher once (the parameter server's address found under SLURM's variables; torchrun's for an all-reduce)
    [(("--strategy", "asgd", "--delay", "0"), "torchrun"), (("--strategy", "ssp", "--staleness", "0"), "slurm")],
    ids=["delayed_averaging-torchrun", "ssp-slurm"],
)
def test_two_nodes_equal_one_node_ddp(tmp_path, tmp_path_factory, strategy, launcher):
    """At staleness 0 / delay 0 both strategies equal DDP: on two nodes as on one."""
    assert REFERENCE[:2] == ("--devices", "2")  # one node of two ranks, split into two nodes of one rank
    ddp = shared_train_script(tmp_path_factory, "--strategy", "ddp", *REFERENCE)
    two_launchers(tmp_path, *strategy, *REFERENCE[2:], launcher=launcher)
    check_equal(tmp_path, ddp)
