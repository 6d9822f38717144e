"""benchmarks/server_capacity.py end to end, on tiny models: a real server and worker processes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "server_capacity.py"

pytestmark = pytest.mark.multiprocess


def test_server_capacity_reports_the_cost_per_push_and_its_parts():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--workers", "1", "2", "--params", "61706", "200000", "400000", "--pushes", "30"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = re.findall(r"^\| (\d) \| ([\d,]+) \| (\d+) \| ([\d.]+) \| (\d+) % \|", proc.stdout, re.MULTILINE)
    assert [(w, p) for w, p, *_ in rows] == [(w, p) for w in "12" for p in ("61,706", "200,000", "400,000")]
    assert all(int(rate) > 0 and float(cpu) > 0 for _, _, rate, cpu, _ in rows)
    # a push of 400,000 values costs the server more than one of 61,706 (copies, the optimizer)
    cost = {(w, p): float(cpu) for w, p, _, cpu, _ in rows}
    assert cost[("1", "400,000")] > cost[("1", "61,706")]
    assert re.search(r"server CPU per push ~ -?[\d.]+ ms per message \+ [\d.]+ ms per million parameters", proc.stdout)
    assert re.search(r"4 server\(s\), LeNet-5: [\d.]+ ms per push on each -> \d+ LeNet-5 workers", proc.stdout)
