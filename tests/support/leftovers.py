"""What a run that ended may have left behind (tests/test_faults.py, tests/test_fault_matrix.py)."""

from __future__ import annotations

from pathlib import Path


def shared_memory_left(started: dict[str, int]) -> list[str]:
    """Parameter-server segments in /dev/shm made by these processes (named lh-ps-<pid>-...)."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        return []
    return [p.name for p in shm.iterdir() if any(p.name.startswith(f"lh-ps-{pid}-") for pid in started.values())]
