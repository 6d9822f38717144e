"""benchmarks/server_capacity.py end to end, on tiny models: a real server and worker processes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import Zygote, clean_env

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "server_capacity.py"

pytestmark = pytest.mark.multiprocess


#: The benchmark's three model sizes: what its per-message/per-parameter fit needs.
SIZES = ("61706", "1000000", "3000000")
ROW = re.compile(r"^\| (\d) \| (shared_memory|channel) \| (\d) \| ([\d,]+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| "
                 r"([\d.]+): ([\d.]+) \+ ([\d.]+) \+ ([\d.]+) \| ([\d.]+) \| (\d+) % \|", re.MULTILINE)


def benchmark(tmp_path: Path, *args: str) -> str:
    """``python benchmarks/server_capacity.py --workers 1 --transports shared_memory --pushes 10 ARGS``
    (forked from the tests' pre-imported Python, tests/support/zygote.py; its workers and servers are new
    processes, as the benchmark starts them): its standard output."""
    proc = Zygote.run([str(SCRIPT), "--workers", "1", "--transports", "shared_memory", "--pushes", "10", *args],
                      clean_env(), tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def check_row(workers, transport, shards, params, rate, cpu, slowest, floor, copy_in, step, copy_out, ratio, busy) -> None:
    assert int(rate) > 0 and float(cpu) > 0
    assert float(slowest) <= float(cpu) + 1e-3  # one shard's share of what all of them spent
    if shards == "1":
        assert float(slowest) == float(cpu)
    assert float(floor) == pytest.approx(float(copy_in) + float(step) + float(copy_out), abs=0.0021)
    assert float(ratio) == pytest.approx(float(cpu) / float(floor), rel=0.02, abs=0.0021)


# 5 server set-ups in two runs of the benchmark, one worker each through shared memory (the benchmark's
# default runs 1 and 2 workers and both transports; the suite's time budget keeps one of each, and the
# channel transport is tested in test_shared_memory.py and test_ssp_strategy.py): one server for each
# of the three model sizes (the per-message/per-parameter fit), then one and two shards for the smallest.
@pytest.mark.timeout(900)
def test_server_capacity_reports_the_cost_per_push_beside_the_floor_for_both_transports_and_shards(tmp_path):
    sizes = ("61,706", "1,000,000", "3,000,000")
    out = benchmark(tmp_path, "--params", *SIZES, "--shards", "1")
    rows = ROW.findall(out)
    assert [(t, k, w, p) for w, t, k, p, *_ in rows] == [("shared_memory", "1", "1", p) for p in sizes]
    for row in rows:
        check_row(*row)
    cost = {p: float(cpu) for w, t, k, p, _, cpu, *_ in rows}
    floor = {p: float(f) for w, _, _, p, _, _, _, f, *_ in rows}
    # a push of 3 M values costs the server more than one of 61,706 (copies, the optimizer), and the
    # floor grows with the size too
    assert cost["3,000,000"] > cost["61,706"]
    assert floor["3,000,000"] > floor["61,706"]
    assert re.search(r"server CPU per push ~ -?[\d.]+ ms per message \+ -?[\d.]+ ms per million parameters", out)  # a fit: noise may tip a sign
    assert re.search(r"4 server\(s\), LeNet-5: [\d.]+ ms per push on each -> \d+ LeNet-5 workers", out)

    sharded = benchmark(tmp_path, "--params", SIZES[0], "--shards", "1", "2")
    rows = ROW.findall(sharded)
    assert [(t, k, w, p) for w, t, k, p, *_ in rows] == [("shared_memory", k, "1", sizes[0]) for k in "12"]
    for row in rows:
        check_row(*row)
    assert len(re.findall(r"^2 shards / 1: [\d.]+x the pushes per second", sharded, re.MULTILINE)) == 1
