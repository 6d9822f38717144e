"""Each process group's device decided in one place (comm/collectives.py), and the backend for the devices.

The bug class: a collective issued with tensors on a device its group cannot serve (a CPU tensor
all-gathered on the workers' NCCL group ended every SSP run on GPUs). On a machine without a GPU it
cannot happen for real, so the CPU suite checks that the package cannot write it: no module but
``comm/collectives.py`` calls torch.distributed's collectives (which move tensors to the group's
device), and the side channel, the only group of its own, is used through ``parameter_server/channel.py`` only.
``tests/gpu`` runs the strategies on CUDA.
"""

from __future__ import annotations

import ast
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_hybrid import DelayedAveragingStrategy, HybridParallelStrategy, PartitionedInferenceStrategy, SSPStrategy
from lightning_hybrid.comm import collectives
from lightning_hybrid.comm.collectives import group_device, workers_backend

PACKAGE = Path(__file__).resolve().parents[2] / "lightning_hybrid"
COLLECTIVES = {
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast", "broadcast_object_list",
    "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "gather_object", "scatter", "scatter_object_list",
    "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv", "batch_isend_irecv", "P2POp",
}
ALLOWED = {PACKAGE / "comm" / "collectives.py"}
CHANNEL = PACKAGE / "parameter_server" / "channel.py"


def distributed_aliases(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Names bound to torch.distributed, and collectives imported by name from it."""
    modules, functions = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch.distributed" and alias.asname:
                    modules.add(alias.asname)
        elif isinstance(node, ast.ImportFrom) and node.module == "torch.distributed":
            functions |= {a.asname or a.name for a in node.names if a.name in COLLECTIVES}
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            modules |= {a.asname or a.name for a in node.names if a.name == "distributed"}
    return modules, functions


def collective_calls(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    modules, functions = distributed_aliases(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = None
        if isinstance(func, ast.Name) and func.id in functions:
            name = func.id
        elif isinstance(func, ast.Attribute) and func.attr in COLLECTIVES:
            owner = func.value
            if isinstance(owner, ast.Name) and owner.id in modules:
                name = func.attr
            elif isinstance(owner, ast.Attribute) and owner.attr == "distributed":  # torch.distributed.X(...)
                name = func.attr
            elif path != CHANNEL and func.attr in ("send", "recv", "recv_anysource") and isinstance(owner, ast.Name) \
                    and owner.id == "pg":  # a raw process group's own methods: the side channel's business
                name = f"pg.{func.attr}"
        if name:
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {name}")
    return found


def test_no_collective_outside_the_module_that_decides_devices():
    calls = [c for p in sorted(PACKAGE.rglob("*.py")) if p not in ALLOWED for c in collective_calls(p)]
    assert not calls, (
        "torch.distributed collectives called directly; call lightning_hybrid.comm.collectives instead, which puts "
        "tensors on the group's device:\n  " + "\n  ".join(calls)
    )


def test_the_check_finds_a_direct_collective(tmp_path):
    bad = PACKAGE / "comm" / "_probe_for_the_check.py"  # inside the package, so relative paths work
    bad.write_text("import torch.distributed as dist\nimport torch\n\ndef f(t):\n    dist.all_gather([t], torch.zeros(2))\n")
    try:
        assert collective_calls(bad) == ["lightning_hybrid/comm/_probe_for_the_check.py:5: all_gather"]
    finally:
        bad.unlink()


def test_group_device_follows_the_backend(monkeypatch):
    monkeypatch.setattr(collectives.dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(collectives.torch.cuda, "current_device", lambda: 3)
    assert group_device() == torch.device("cuda", 3)
    monkeypatch.setattr(collectives.dist, "get_backend", lambda group=None: "gloo")
    assert group_device() == torch.device("cpu")


CUDA0, CUDA1, CPU = torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cpu")


@pytest.mark.parametrize(
    "devices, requested, backend, noted",
    [
        ([CPU, CPU], None, "gloo", False),
        ([CUDA0, CUDA1], None, "nccl", False),
        ([CUDA0, CUDA0], None, "gloo", True),  # two workers on one GPU: NCCL refuses them
        ([CUDA0, CUDA0], "gloo", "gloo", False),
        ([CUDA0, CUDA1], "gloo", "gloo", False),
    ],
)
def test_workers_backend(devices, requested, backend, noted):
    chosen, note = workers_backend(devices, requested)
    assert chosen == backend and bool(note) == noted
    if noted:
        assert "share 1 GPU" in note and "gloo" in note


@pytest.mark.parametrize(
    "devices, requested, match",
    [([CUDA0, CUDA0], "nccl", "NCCL cannot serve two processes on one GPU"), ([CPU, CPU], "nccl", "serves CUDA devices only")],
)
def test_a_backend_that_cannot_serve_the_devices_is_refused(devices, requested, match):
    with pytest.raises(ValueError, match=match):
        workers_backend(devices, requested)


@pytest.mark.parametrize("cls", [SSPStrategy, DelayedAveragingStrategy, PartitionedInferenceStrategy])
def test_processes_per_device_share_a_gpu_over_gloo(cls):
    strategy = cls(processes_per_device=2, parallel_devices=[CUDA0])
    assert strategy.parallel_devices == [CUDA0, CUDA0] and strategy.num_processes == 2
    assert strategy._get_process_group_backend() == "gloo"
    strategy.check_devices()
    with pytest.raises(ValueError, match="process_group_backend='nccl'.*set process_group_backend=null"):
        cls(processes_per_device=2, parallel_devices=[CUDA0], process_group_backend="nccl").check_devices()
    with pytest.raises(ValueError, match="processes_per_device must be a positive integer"):
        cls(processes_per_device=0)


def test_pipeline_stages_may_share_a_gpu():
    """Stages exchange activations through comm.collectives, which stages CUDA tensors through the CPU for gloo."""
    strategy = HybridParallelStrategy(processes_per_device=2, parallel_devices=[CUDA0])
    strategy.check_devices()
    assert strategy._get_process_group_backend() == "gloo"


def _exercise(rank: int, world: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = {"device": str(group_device())}
    results["gathered"] = [t.tolist() for t in collectives.all_gather(torch.tensor([rank, 10.0 * rank], dtype=torch.float64))]
    matrix = torch.arange(6.0).reshape(2, 3) * (rank + 1)
    view = matrix.t()  # not contiguous: staged through a copy and written back
    collectives.broadcast_(view, src=1)
    results["broadcast"] = matrix.tolist()
    summed = torch.ones(3) * (rank + 1)
    results["all_reduce"] = collectives.all_reduce_(summed).tolist()
    results["pending"] = collectives.start_all_reduce(torch.full((2,), float(rank))).wait().tolist()
    results["objects"] = collectives.all_gather_object({"rank": rank})
    results["object"] = collectives.broadcast_object("from 0" if rank == 0 else None, src=0)
    peer = 1 - rank
    inbox = torch.empty(2, 2)
    collectives.exchange([(torch.full((2, 2), float(rank)), peer)], [(inbox.t(), peer)])
    results["exchanged"] = inbox.tolist()

    class Bucket:  # the part of dist.GradBucket a communication hook reads
        def __init__(self, values):
            self.values = values

        def buffer(self):
            return self.values

    gradients = torch.tensor([1.0 + rank * 2**-9, 3.0 * (rank + 1)])  # 1 + 2^-9 is 1 in bf16 (8 significant bits)
    averaged = collectives.bf16_wire_hook(None, Bucket(gradients)).wait()
    results["bf16_wire"] = (averaged.dtype, averaged.tolist(), averaged is gradients)
    torch.save(results, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.multiprocess
def test_collectives_on_two_gloo_processes(tmp_path):
    init_file = tempfile.mktemp(dir=tmp_path)
    mp.start_processes(_exercise, args=(2, init_file, str(tmp_path)), nprocs=2, join=True, start_method="forkserver")
    for rank in (0, 1):
        r = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert r["device"] == "cpu"
        assert r["gathered"] == [[0.0, 0.0], [1.0, 10.0]]
        assert r["broadcast"] == (torch.arange(6.0).reshape(2, 3) * 2).tolist()
        assert r["all_reduce"] == [3.0, 3.0, 3.0] and r["pending"] == [1.0, 1.0]
        assert r["objects"] == [{"rank": 0}, {"rank": 1}] and r["object"] == "from 0"
        assert r["exchanged"] == [[float(1 - rank)] * 2] * 2
        # DDP's bf16 hook: averaged in bf16 (fp32 would give 1 + 2^-10), written back into the fp32 bucket
        assert r["bf16_wire"] == (torch.float32, [1.0, 4.5], True)

