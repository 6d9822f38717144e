"""Watching a run's processes: a death ends the run at once, with one last message naming it.

Lightning's own observer of the child ranks polls every 5 s, logs at INFO level and SIGKILLs the
main process, so a run whose worker died ended with a bare "Child process ... terminated" line or,
worse, with the tracebacks of the survivors, which blame the process they were talking to.
:class:`RankExitWatch` runs in the main process (the one that started the others: local rank 0):

* it polls the processes it watches (the child ranks, and the parameter server where there is one)
  every ``interval`` seconds; when one ends with a non-zero code, it stops every other process it
  watches (SIGKILL: no survivor prints a traceback), writes one message naming the dead process
  (role, rank, pid, signal or exit code) as the run's last output, and ends the main process;
* the main process asks it, when an error of its own ends the run, whether a watched process died
  first (then the message names that one), else to stop the others so that the main process's
  own error is the last thing printed;
* each started process gets the kernel's parent-death signal (Linux), so none outlives a main
  process that was killed; at a normal exit the main process waits for its children before it ends.

Plain Python (no Lightning): the strategies' launcher (:mod:`lightning_hybrid.strategies.launcher`)
wires it in.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from collections.abc import Callable
from typing import NoReturn

log = logging.getLogger(__name__)

#: Set by the launcher for the processes it starts: the pid of the main process.
LAUNCHER_PID_ENV = "LIGHTNING_HYBRID_LAUNCHER_PID"
#: How long a started process that failed waits before printing its error, so that the main process
#: can first end the run when the failure was a consequence of another process's death.
CHILD_GRACE_S = 2.0
_PR_SET_PDEATHSIG = 1


@dataclass
class Watched:
    """One process of the run: its role ("worker", "parameter server"), global rank (None: none),
    and whether its death ends the run (``fatal``) or the run goes on without it."""

    role: str
    rank: int | None
    process: subprocess.Popen
    fatal: bool = True
    reported: bool = False  # a non-fatal death, already reported

    def describe(self) -> str:
        rank = f" rank {self.rank}" if self.rank is not None else ""
        return f"{self.role}{rank} (pid {self.process.pid})"


def describe_exit(code: int) -> str:
    """``-9`` -> "was killed by signal SIGKILL"; ``1`` -> "exited with code 1"."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"was killed by signal {name}"
    return f"exited with code {code}"


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; elsewhere nothing).
    Called in a child right after it starts; exits at once if the parent is already gone."""
    expected = os.environ.get(LAUNCHER_PID_ENV)
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the parameter server's own orphan check still holds
        return
    if expected is not None and os.getppid() != int(expected):
        os._exit(1)  # the main process died before the signal was armed


class RankExitWatch:
    """Watches processes of a run from its main process (see the module docstring).

    Args:
        interval: seconds between polls.
        stream_fd: the file descriptor the final message is written to (default 2: standard error).

    Example::

        >>> watch = RankExitWatch()
        >>> # watch.add("worker", 1, popen); watch.start(); ...; watch.forget(popen) before ending it
    """

    def __init__(self, interval: float = 0.2, stream_fd: int = 2) -> None:
        self.interval = interval
        self.stream_fd = stream_fd
        self._watched: list[Watched] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._ending = False

    def add(self, role: str, rank: int | None, process: subprocess.Popen, fatal: bool = True) -> None:
        """Watch ``process``; with ``fatal=False`` its death is reported and the run goes on."""
        with self._lock:
            self._watched.append(Watched(role, rank, process, fatal))

    def forget(self, process: subprocess.Popen) -> None:
        """Stop watching ``process`` (before ending it on purpose)."""
        with self._lock:
            self._watched = [w for w in self._watched if w.process is not process]

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lightning-hybrid-process-watch", daemon=True)
            self._thread.start()
            atexit.register(self.wait_for_children)

    def _run(self) -> None:
        while not self._ending:
            time.sleep(self.interval)
            dead = None if self._ending else self.dead(fatal_only=True)
            if dead is not None:
                self.end_run(dead)
            self._report_tolerated_deaths()

    def _report_tolerated_deaths(self) -> None:
        with self._lock:
            newly = [w for w in self._watched if not w.fatal and not w.reported and w.process.poll() not in (None, 0)]
            for w in newly:
                w.reported = True
        for w in newly:
            message = f"lightning-hybrid: {w.describe()} {describe_exit(w.process.returncode)}; the run goes on without it"
            os.write(self.stream_fd, ("\n" + message + ".\n").encode())

    def dead(self, fatal_only: bool = False) -> Watched | None:
        """The watched process whose death most likely caused the others', among those that ended
        with a non-zero code (``fatal_only``: of those whose death ends the run); None if none did.

        One poll can find several dead: a killed worker's parameter server notices at once that the
        worker is gone and exits with an error within the same interval. A process killed by a
        signal is named before one that exited with a code, and a rank before a process of no rank
        (a parameter server ends with an error when a worker is lost); otherwise the order they were added.
        """
        with self._lock:
            watched = [w for w in self._watched if w.fatal or not fatal_only]
        ended = [w for w in watched if w.process.poll() not in (None, 0)]
        return min(ended, key=_consequence_rank, default=None)

    def end_run(self, dead: Watched) -> NoReturn:
        """Stop every other watched process, write the final message, end this process (code 1)."""
        def message(stopped: list[Watched]) -> str:
            text = f"lightning-hybrid: {dead.describe()} {describe_exit(dead.process.returncode)}; the run is stopped"
            return text + (f" (also stopped: {', '.join(w.describe() for w in stopped)})" if stopped else "") + "."

        self._stop_all_and_exit(message, spare=dead)

    def stop_all(self, message: str) -> NoReturn:
        """End the run for a reason of the main process's own (the watchdog's): stop every watched
        process, write ``message`` as the run's last output, end this process (code 1)."""
        self._stop_all_and_exit(lambda stopped: message)

    def _stop_all_and_exit(self, message: Callable[[list[Watched]], str], spare: Watched | None = None) -> NoReturn:
        with self._lock:
            if self._ending:  # another thread is already ending the run
                while True:
                    time.sleep(1)
            self._ending = True
            others = [w for w in self._watched if w is not spare]
        stopped = [w for w in others if _kill(w.process)]
        # From here on, nothing the main thread prints can come after the message.
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115
        os.write(self.stream_fd, ("\n" + message(stopped) + "\n").encode())
        os._exit(1)

    def after_own_error(self, grace_s: float = 0.5) -> None:
        """The main process's run failed: if a watched process died (within ``grace_s``), end the run
        naming it; otherwise stop the others, so that the main process's error is printed last."""
        deadline = time.monotonic() + grace_s
        while True:
            dead = self.dead()
            if dead is not None:
                self.end_run(dead)
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        with self._lock:
            self._ending = True  # what dies now dies because it is stopped
            watched = list(self._watched)
        for w in watched:
            _kill(w.process)

    def wait_for_children(self, timeout_s: float = 30.0) -> None:
        """At the main process's exit: give the watched processes ``timeout_s`` to end, then kill them."""
        with self._lock:
            self._ending = True
            watched = list(self._watched)
        deadline = time.monotonic() + timeout_s
        for w in watched:
            try:
                w.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("lightning-hybrid: %s did not end within %.0f s of the run; killing it", w.describe(), timeout_s)
                _kill(w.process)


def _consequence_rank(watched: Watched) -> tuple[bool, bool]:
    """Sorts the dead of one poll cause first: killed by a signal, then ranks before servers."""
    return watched.process.returncode >= 0, watched.rank is None


def _kill(process: subprocess.Popen) -> bool:
    """SIGKILL ``process`` if it still runs and reap it; say whether it was running."""
    if process.poll() is not None:
        return False
    process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel: it dies when it returns
        process.wait(timeout=5)
    return True
