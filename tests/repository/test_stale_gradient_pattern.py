"""benchmarks/stale_gradient_pattern.py: the replay of SSP's straggler pattern is DDP when nothing is stale."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "stale_gradient_pattern.py"


def test_the_pattern_with_fresh_gradients_is_ddp_and_the_stale_one_differs(real_mnist):
    spec = importlib.util.spec_from_file_location("stale_gradient_pattern", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    data, test = bench.load(real_mnist, "train"), bench.load(real_mnist, "t10k")
    runs = {p: bench.train(p, 0, data, test, steps=100, lr=0.02, momentum=0.9) for p in ("ddp", "fresh", "stale")}
    assert len(runs["ddp"]) == 1 and 0.5 < runs["ddp"][0] <= 1.0
    assert runs["fresh"] == runs["ddp"]  # same batches, same order, same updates
    assert runs["stale"] != runs["ddp"]
