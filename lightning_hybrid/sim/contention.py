"""Real CPU contention: busy processes pinned to some cores, for the ranks pinned there to share.

A simulated slowdown (:mod:`~lightning_hybrid.sim.slowdown`) sleeps where the simulator puts it; real
contention slows a rank wherever the operating system takes its core away, so no strategy can know
where the time goes. :class:`Competitor` starts CPU-bound processes (plain Python busy loops,
``os.sched_setaffinity`` to the given cores) and stops them; a rank shares a core with them when it
is pinned there too (``HeterogeneitySimulator(affinity=...)``, ``sim.affinity`` on the command line).
A rank sharing its core with ``k`` competitors gets about ``1 / (k + 1)`` of it: ``k + 1`` times
slower. With ``duty < 1`` the competitors come and go: every ``period_s`` they run with
probability ``duty`` and are stopped (SIGSTOP) otherwise, transient stragglers from contention.
Linux only (``os.sched_setaffinity``).

Example::

    >>> with Competitor(cores=[1]):      # doctest: +SKIP
    ...     pass  # run the training whose straggler rank is pinned to core 1
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable

#: The competitor's program: pin itself, then spin until killed.
_SPIN = "import os, sys\nos.sched_setaffinity(0, {int(c) for c in sys.argv[1:]})\nwhile True:\n    pass\n"


def check_cores(cores: Iterable[int]) -> list[int]:
    """``cores`` as a sorted list, if every one is a core this process may run on; else a ValueError."""
    if not hasattr(os, "sched_getaffinity"):
        raise ValueError("pinning processes to cores needs os.sched_setaffinity (Linux)")
    wanted = sorted({int(c) for c in cores})
    allowed = os.sched_getaffinity(0)
    if not wanted or not set(wanted) <= allowed:
        raise ValueError(f"cores {wanted} are not all among this machine's usable cores {sorted(allowed)}")
    return wanted


class Competitor:
    """``processes`` CPU-bound processes pinned to ``cores`` while the context is open (or between
    :meth:`start` and :meth:`stop`), running all the time or, with ``duty < 1``, in random spells.

    Args:
        cores: the cores they are pinned to.
        processes: how many (a rank alone on one of the cores with them runs ``processes + 1`` times slower).
        duty: the probability that they run in each period (1: always).
        period_s: the length of a period.
        seed: seed of the periods' draws.
    """

    def __init__(self, cores: Iterable[int], processes: int = 1, duty: float = 1.0, period_s: float = 0.05,
                 seed: int = 0) -> None:
        self.cores = check_cores(cores)
        if not (isinstance(processes, int) and processes >= 1):
            raise ValueError(f"processes must be an integer >= 1, got {processes!r}")
        if not 0.0 < duty <= 1.0:
            raise ValueError(f"duty must be a probability in (0, 1], got {duty}")
        if not period_s > 0:
            raise ValueError(f"period_s must be positive, got {period_s}")
        self.processes_wanted, self.duty, self.period_s, self.seed = processes, float(duty), float(period_s), seed
        self.processes: list[subprocess.Popen] = []
        #: Periods in which the competitors ran, and all periods (``duty < 1``).
        self.busy_periods = self.periods = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Competitor:
        if not self.processes:
            self.processes = [subprocess.Popen([sys.executable, "-c", _SPIN, *map(str, self.cores)])
                              for _ in range(self.processes_wanted)]
            if self.duty < 1.0:
                self._stop.clear()
                self._thread = threading.Thread(target=self._spells, daemon=True, name="competitor-spells")
                self._thread.start()
        return self

    def _signal(self, sig: int) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.kill(process.pid, sig)

    def _spells(self) -> None:
        rng, running = random.Random(self.seed), True
        while not self._stop.is_set():
            run = rng.random() < self.duty
            if run != running:
                self._signal(signal.SIGCONT if run else signal.SIGSTOP)
                running = run
            self.periods += 1
            self.busy_periods += run
            self._stop.wait(self.period_s)

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        for process in self.processes:
            process.kill()
            process.wait()
        self.processes = []

    def __enter__(self) -> Competitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
