"""A rank as a device of its own speed: a share of the CPU's time, not a sleep.

A simulated slowdown (:mod:`~lightning_hybrid.sim.slowdown`) sleeps, and on a machine whose ranks share
cores a sleeping rank lends its core to the others: a strategy whose ranks take turns (a pipeline) gets
the slow ranks' time for free, one whose ranks compute at once (DDP) does not. Real devices lend nothing.
:class:`CpuShare` puts the calling process (all its threads, and the processes it starts) in a CPU control
group of its own whose scheduler quota is ``cores`` cores' worth of time a period (Linux's CFS bandwidth
control: ``cpu.max`` in cgroup v2, ``cpu.cfs_quota_us`` in v1): it computes at that speed and what it leaves
unused nobody else gets. Ranks of shares ``[0.25, 0.5]`` are devices of speeds 1 and 2 (with one thread
each) that do not lend each other time. Needs a writable CPU cgroup hierarchy (root, or a delegated one).

Example::

    >>> with CpuShare(0.5, name="rank0"):   # doctest: +SKIP
    ...     pass  # this process computes at half a core
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

#: Where the groups are made: cgroup v2's unified hierarchy, or v1's cpu controller.
V2, V1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpu")
PERIOD_US = 10_000  # a short period, so that a share is smooth at a training step's scale


class CpuShare:
    """This process in a CPU cgroup of its own limited to ``cores`` cores' worth of time (see the module).

    ``name``: the group's name under ``lightning_hybrid/`` (made unique with the process id). Leaving
    (:meth:`close`, or the ``with`` block's end) moves the process back and removes the group.
    """

    def __init__(self, cores: float, name: str, root: Path | None = None) -> None:
        if not (isinstance(cores, (int, float)) and cores > 0):
            raise ValueError(f"a CPU share is a positive number of cores, got {cores!r}")
        self.cores, self.quota_us = float(cores), max(1000, round(float(cores) * PERIOD_US))
        self.root = root if root is not None else _hierarchy()
        self.group = self.root / "lightning_hybrid" / f"{name}-{os.getpid()}"
        self._parent: Path | None = None

    def open(self) -> CpuShare:
        if self._parent is not None:  # open already: its group is not the one to return to
            return self
        v2 = (self.root / "cgroup.controllers").is_file()
        try:
            parent = _own_group(self.root, v2)
            if v2:  # the cpu controller must be enabled in each parent's subtree
                for above in (self.root, self.root / "lightning_hybrid"):
                    above.mkdir(exist_ok=True)
                    (above / "cgroup.subtree_control").write_text("+cpu")
            self.group.parent.mkdir(parents=True, exist_ok=True)
            _remove_stale_groups(self.group.parent)
            self.group.mkdir(exist_ok=True)
            if v2:
                (self.group / "cpu.max").write_text(f"{self.quota_us} {PERIOD_US}")
            else:
                (self.group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (self.group / "cpu.cfs_quota_us").write_text(str(self.quota_us))
            (self.group / "cgroup.procs").write_text(str(os.getpid()))
        except OSError as error:
            raise OSError(
                f"sim.cpu_share needs a writable CPU control group hierarchy ({self.root}: {error.strerror or error}); "
                "run as root (or in a delegated cgroup), or simulate speeds with sim.slowdown instead"
            ) from None
        self._parent = parent  # open only once in its group
        return self

    def close(self) -> None:
        """Move this process back to the group it came from and remove its own (once empty: a loader worker
        started in it may live on, and keeps it)."""
        if self._parent is None:
            return
        with contextlib.suppress(OSError):
            (self._parent / "cgroup.procs").write_text(str(os.getpid()))
            self.group.rmdir()
        self._parent = None

    def __enter__(self) -> CpuShare:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _remove_stale_groups(parent: Path) -> None:
    """Remove the groups in ``parent`` that killed runs left (named ``<name>-<pid>``, their process gone);
    one still holding a process that run started stays."""
    for group in parent.iterdir():
        pid = group.name.rpartition("-")[2]
        if group.is_dir() and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                group.rmdir()


def _hierarchy() -> Path:
    return V1 if (V1 / "cpu.cfs_quota_us").is_file() else V2


def _own_group(root: Path, v2: bool) -> Path:
    """The group this process is in, in ``root``'s hierarchy (to return to)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (v2 and controllers == "") or (not v2 and "cpu" in controllers.split(",")):
            return root / path.lstrip("/")
    return root
