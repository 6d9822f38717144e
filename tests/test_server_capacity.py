"""benchmarks/server_capacity.py end to end, on tiny models: a real server and worker processes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "server_capacity.py"

pytestmark = pytest.mark.multiprocess


# 6 server set-ups, one worker each through shared memory (the benchmark's default runs 1 and 2 workers
# and both transports; the suite's time budget keeps one of each, and the channel transport is tested in
# test_shared_memory.py and test_ssp_strategy.py): its three model sizes are what the per-message/per-parameter
# fit needs.
@pytest.mark.timeout(900)
def test_server_capacity_reports_the_cost_per_push_beside_the_floor_for_both_transports_and_shards():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--workers", "1", "--transports", "shared_memory", "--params", "61706", "1000000", "3000000", "--pushes", "10",
         "--shards", "1", "2"],
        capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = re.findall(
        r"^\| (\d) \| (shared_memory|channel) \| (\d) \| ([\d,]+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| "
        r"([\d.]+): ([\d.]+) \+ ([\d.]+) \+ ([\d.]+) \| ([\d.]+) \| (\d+) % \|", proc.stdout, re.MULTILINE)
    sizes = ("61,706", "1,000,000", "3,000,000")
    assert [(t, k, w, p) for w, t, k, p, *_ in rows] == [
        (t, k, w, p) for t in ("shared_memory",) for k in "12" for w in "1" for p in sizes]
    for workers, transport, shards, params, rate, cpu, slowest, floor, copy_in, step, copy_out, ratio, busy in rows:
        assert int(rate) > 0 and float(cpu) > 0
        assert float(slowest) <= float(cpu) + 1e-3  # one shard's share of what all of them spent
        if shards == "1":
            assert float(slowest) == float(cpu)
        assert float(floor) == pytest.approx(float(copy_in) + float(step) + float(copy_out), abs=0.0021)
        assert float(ratio) == pytest.approx(float(cpu) / float(floor), rel=0.02, abs=0.0021)
    cost = {(t, k, w, p): float(cpu) for w, t, k, p, _, cpu, *_ in rows}
    floor = {p: float(f) for w, _, _, p, _, _, _, f, *_ in rows if w == "1"}
    # a push of 3 M values costs the server more than one of 61,706 (copies, the optimizer), and the
    # floor grows with the size too
    assert cost[("shared_memory", "1", "1", "3,000,000")] > cost[("shared_memory", "1", "1", "61,706")]
    assert floor["3,000,000"] > floor["61,706"]
    assert len(re.findall(r"^2 shards / 1: [\d.]+x the pushes per second", proc.stdout, re.MULTILINE)) == 3
    assert re.search(r"server CPU per push ~ -?[\d.]+ ms per message \+ [\d.]+ ms per million parameters", proc.stdout)
    assert re.search(r"4 server\(s\), LeNet-5: [\d.]+ ms per push on each -> \d+ LeNet-5 workers", proc.stdout)
