"""Starting a run's other ranks by forking the main process when the Trainer launches, rather than
by running the script again in a new interpreter (Lightning's "popen" start).

A re-run script imports torch and Lightning again (about 4 s of CPU per process, most of a short
run's start-up on a small machine) and repeats everything the script did before the Trainer call.
A forked rank starts from the main process's state at that call: the same model, data module and
Trainer, already built, and then, like a re-run script, it runs the training and the rest of the
script on its own. Two things differ from a re-run, and :func:`fork_ranks` documents them to users
through the strategies' ``fork_ranks`` argument: the code before the Trainer call ran once (in the
main process, with ``LOCAL_RANK`` unset), and CUDA must not be initialized before the fork.

Plain Python (no Lightning): :class:`~lightning_hybrid.strategies.common.CheckingLauncher` uses it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch


class ForkedProcess:
    """The part of :class:`subprocess.Popen`'s interface that the launcher and
    :class:`~lightning_hybrid.strategies.process_watch.ProcessWatch` use, for a forked child."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere
                self.returncode = self.returncode if self.returncode is not None else 0
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def fork_ranks(num_processes: int) -> tuple[int, list[ForkedProcess]]:
    """Fork local ranks ``1 .. num_processes - 1`` from this process (local rank 0).

    Returns ``(local_rank, children)``: in this process ``(0, [a handle per child])``; in a child
    ``(its local rank, [])``, with ``LOCAL_RANK`` set in its environment. The caller has set the
    rest of the ranks' environment (``MASTER_ADDR``, ``WORLD_SIZE``, ...) beforehand.
    """
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "fork_ranks=True: CUDA was initialized in this process before the Trainer started its ranks, and a "
            "forked process cannot use CUDA then. Do not touch CUDA before trainer.fit (no .cuda(), no "
            "torch.cuda calls that create a context), or use fork_ranks=False (each rank runs the script anew)."
        )
    sys.stdout.flush()
    sys.stderr.flush()  # what is buffered now would otherwise be printed by every child too
    children: list[ForkedProcess] = []
    for local_rank in range(1, num_processes):
        pid = os.fork()
        if pid == 0:
            os.environ["LOCAL_RANK"] = str(local_rank)
            return local_rank, []
        children.append(ForkedProcess(pid))
    return 0, children
