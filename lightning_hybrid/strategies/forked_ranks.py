"""Starting a run's other ranks by forking the main process when the Trainer launches, rather than
by running the script again in a new interpreter (Lightning's "popen" start).

A re-run script imports torch and Lightning again (about 4 s of CPU per process, most of a short
run's start-up on a small machine) and repeats everything the script did before the Trainer call.
A forked rank starts from the main process's state at that call: the same model, data module and
Trainer, already built, and then, like a re-run script, it runs the training and the rest of the
script on its own. Two things differ from a re-run, and :func:`fork_ranks` documents them to users
through the strategies' ``fork_ranks`` argument: the code before the Trainer call ran once (in the
main process, with ``LOCAL_RANK`` unset), and CUDA must not be initialized before the fork.

A process a rank starts later (the parameter server) can be forked at the same moment, before any
thread or process group exists, as a :class:`Standby` that waits for its settings.

Plain Python (no Lightning): :class:`~lightning_hybrid.strategies.launcher.CheckingLauncher` and the
parameter-server strategies use it.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
import traceback
from collections.abc import Callable

import torch


class ForkedProcess:
    """The part of :class:`subprocess.Popen`'s interface that the launcher and
    :class:`~lightning_hybrid.strategies.rank_exit_watch.RankExitWatch` use, for a forked child."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its exit code is lost
                self.returncode = 0
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


def _refuse_after_cuda() -> None:
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "fork_ranks=True: CUDA was initialized in this process before the Trainer started its ranks, and a "
            "forked process cannot use CUDA then. Do not touch CUDA before trainer.fit (no .cuda(), no "
            "torch.cuda calls that create a context), or use fork_ranks=False (each rank runs the script anew)."
        )


def _fork() -> int:
    sys.stdout.flush()
    sys.stderr.flush()  # what is buffered now would otherwise be printed by every child too
    return os.fork()


class Standby:
    """A child forked now that waits for one message, then runs ``target(message)`` (which must end
    the process; if it returns or raises, the child exits with code 0 or 1). :meth:`start` sends the
    message; a standby never started exits when this process closes its end (at exit at the latest).

    Example::

        >>> standby = Standby(lambda text: os._exit(len(text)))
        >>> standby.start("abc").wait()
        3
    """

    def __init__(self, target: Callable[[str], None]) -> None:
        read_fd, self._write_fd = os.pipe()
        pid = _fork()
        if pid == 0:
            os.close(self._write_fd)
            code = 0
            try:
                message = _read_message(read_fd)
                if message is not None:
                    target(message)
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(read_fd)
        self.process = ForkedProcess(pid)

    def start(self, message: str) -> ForkedProcess:
        data = message.encode()
        os.write(self._write_fd, struct.pack("<Q", len(data)) + data)
        os.close(self._write_fd)
        return self.process


def _read_message(fd: int) -> str | None:
    """A length-prefixed message from ``fd``; None when the writer closed without sending one."""
    def read(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = os.read(fd, n - len(data))
            if not chunk:
                return data
            data += chunk
        return data

    header = read(8)
    if len(header) < 8:
        return None
    return read(struct.unpack("<Q", header)[0]).decode()


def fork_ranks(num_processes: int) -> tuple[int, list[ForkedProcess]]:
    """Fork local ranks ``1 .. num_processes - 1`` from this process (local rank 0).

    Returns ``(local_rank, children)``: in this process ``(0, [a handle per child])``; in a child
    ``(its local rank, [])``, with ``LOCAL_RANK`` set in its environment. The caller has set the
    rest of the ranks' environment (``MASTER_ADDR``, ``WORLD_SIZE``, ...) beforehand.
    """
    _refuse_after_cuda()
    children: list[ForkedProcess] = []
    for local_rank in range(1, num_processes):
        pid = _fork()
        if pid == 0:
            os.environ["LOCAL_RANK"] = str(local_rank)
            return local_rank, []
        children.append(ForkedProcess(pid))
    return 0, children
