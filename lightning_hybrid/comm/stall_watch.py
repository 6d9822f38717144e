"""A watch over a rank that stops making progress: every rank's stack, one message, the run ended.

A distributed run hangs when its ranks wait in different collectives (one rank issued a collective
the others did not) or when a process stops answering: the ranks then wait until a timeout of half
an hour, saying nothing. :class:`StallWatch` is a thread in each rank. The rank's main thread
:meth:`~StallWatch.beat`\\ s whenever it gets on (each batch, each hook); when no beat came for
longer than the limit (``limit_s``, or ``slack`` times the longest gap between beats seen so far,
whichever is larger: a run's legitimate waits set how patient it is; a wait with a timeout and an
error of its own, :func:`excused_wait`, does not count), the watch

1. writes the rank's Python stack (every thread, :mod:`faulthandler`) to the log,
2. posts where the rank's main thread waits, and that it stalled, on the run's
   :class:`~lightning_hybrid.comm.board.Board` (the other ranks' watches read that within a
   second and post their positions too: the whole run reports at once),
3. on rank 0: collects every rank's position and ends the run with one message
   (:func:`stall_message`): each rank's position, and whether the ranks are out of step (waiting in
   different calls: a collective some ranks issued and the others did not) or all wait in the same
   call (a peer or the network stalled, or a step longer than the limit); the other ranks wait for
   rank 0 to end the run and end themselves after a grace period if it does not.

Plain Python and ``torch.distributed``'s store: the Lightning callback that beats and ends the run is
:class:`lightning_hybrid.watchdog.StallWatchdog`.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TextIO

from lightning_hybrid.comm.board import Board

#: Seconds rank 0 waits for the others' positions after a stall.
GATHER_S = 10.0
#: Seconds a rank other than 0 waits, after reporting, for rank 0 to end the run.
GRACE_S = 30.0
#: Where library code lives: a position names the innermost call outside these (the code that issued it).
_LIBRARIES = ("torch", "pytorch_lightning", "lightning", "lightning_fabric", "lightning_utilities", "torchmetrics",
              "hydra", "omegaconf")
_STDLIB = sysconfig.get_paths()["stdlib"]
_EXCUSED = [0]  # how many excused waits the process is in (its main thread's)


@contextlib.contextmanager
def excused_wait() -> Iterator[None]:
    """A wait no watch counts as a stall: one that has a timeout and an error of its own (a
    parameter-server worker waiting for its server's reply: the server answers when the worker's peers
    have pushed, and fails by itself when one stops talking to it)."""
    _EXCUSED[0] += 1
    try:
        yield
    finally:
        _EXCUSED[0] -= 1


def _in_library(filename: str) -> bool:
    if filename.startswith(_STDLIB) and "site-packages" not in filename or filename.startswith("<"):
        return True
    parts = filename.replace("\\", "/").split("/")
    return any(part in _LIBRARIES for part in parts[-6:-1]) and "lightning_hybrid" not in parts


def _where(frame: FrameType) -> str:
    code = frame.f_code
    name = getattr(code, "co_qualname", code.co_name)
    parts = code.co_filename.replace("\\", "/").split("/")
    return f"{name} ({'/'.join(parts[-2:])}:{frame.f_lineno})"


def describe_position(frame: FrameType | None) -> str:
    """Where a thread waits: its innermost call, and the innermost call outside the libraries (the code
    that issued it, e.g. a callback's hook), as ``all_gather (...:3977) from ProgressLog.on_train_epoch_end
    (lightning_hybrid/callbacks/progress.py:40)``."""
    if frame is None:
        return "(no Python frame: outside Python)"
    innermost, caller = _where(frame), None
    walker: FrameType | None = frame
    while walker is not None:
        if not _in_library(walker.f_code.co_filename):
            caller = _where(walker)
            break
        walker = walker.f_back
    return innermost if caller is None or caller == innermost else f"{innermost} from {caller}"


def stall_message(positions: dict[int, str | None], waited_s: float, limit_s: float, setting: str) -> str:
    """The run's last message: each rank's position (None: it did not answer), and what it means."""
    lines = [f"  rank {rank}: {'no answer (dead, or stuck outside Python)' if where is None else where}"
             for rank, where in sorted(positions.items())]
    answered = {where for where in positions.values() if where is not None}
    if len(answered) > 1:
        head = (f"the ranks are out of step: no progress for {waited_s:.0f} s, each rank waiting in a different call "
                f"(the limit is {limit_s:.0f} s, {setting}):")
        tail = ("A rank issued a collective (a metric's synchronisation, a barrier, a gather) that the others did not: "
                "look for one under `trainer.is_global_zero` or another per-rank condition in the callers above. "
                "Every rank's Python stack is above this message.")
    else:
        head = (f"no progress for {waited_s:.0f} s, every rank waiting in the same call (the limit is {limit_s:.0f} s, "
                f"{setting}):")
        tail = ("The ranks are in step, so they wait for something outside them: a process that stopped answering, "
                "the network, or a step that takes longer than the limit (then raise it). Every rank's Python stack "
                "is above this message.")
    return "\n".join([f"lightning-hybrid: {head}", *lines, tail])


class StallWatch:
    """The watch thread of one rank (see the module docstring).

    Args:
        rank, world_size: this rank and how many there are.
        limit_s: seconds without a beat that count as a stall (at least; see ``slack``).
        board: the run's board (None with one process: no positions to gather).
        end_run: called on rank 0 with the final message; it ends the run (and does not return).
        slack: a stall is also never shorter than ``slack`` times the longest gap between beats seen.
        setting: how the user changes the limit, named in the message (e.g. ``watchdog_s=300``).
        stream: where the stacks go (standard error).
        poll_s: how often the thread looks (and reads the board).
    """

    def __init__(self, rank: int, world_size: int, limit_s: float, board: Board | None,
                 end_run: Callable[[str], None], slack: float = 10.0, setting: str = "", stream: TextIO | None = None,
                 poll_s: float = 1.0) -> None:
        if not limit_s > 0:
            raise ValueError(f"the watchdog's limit must be positive seconds, got {limit_s}")
        self.rank, self.world_size, self.limit_s, self.board = rank, world_size, float(limit_s), board
        self.end_run, self.slack, self.setting = end_run, float(slack), setting
        self.stream, self.poll_s = stream, poll_s
        self._main = threading.main_thread()
        self._last: float | None = None  # no beat yet: not armed
        self._longest = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Whether this watch found a stall (its rank then reported).
        self.stalled = False

    @property
    def limit(self) -> float:
        return max(self.limit_s, self.slack * self._longest)

    def beat(self) -> None:
        """The main thread got on (cheap: two clock reads)."""
        now = time.monotonic()
        if self._last is not None:
            self._longest = max(self._longest, now - self._last)
        self._last = now

    def pause(self) -> None:
        """No watching until the next beat (between phases whose gaps are not steps)."""
        self._last = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lightning-hybrid-stall-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if _EXCUSED[0] and self._last is not None:
                self._last = time.monotonic()  # the gap starts again when the excused wait ends
                continue
            last = self._last
            waited = 0.0 if last is None else time.monotonic() - last
            if last is not None and waited > self.limit:
                self._report(waited)
                return
            if self.board is not None and self.board.read("stalled") is not None:
                self._report(waited)  # another rank stalled: say where this one is
                return

    def position(self) -> str:
        return describe_position(sys._current_frames().get(self._main.ident))

    def _report(self, waited: float) -> None:
        self.stalled = True
        where = self.position()
        stream = self.stream or sys.stderr
        try:
            stream.write(f"\nlightning-hybrid: rank {self.rank}: no progress for {waited:.0f} s; its Python stack:\n")
            stream.flush()
            faulthandler.dump_traceback(file=stream, all_threads=True)
        except (OSError, ValueError):
            pass  # no stream to write to: the position still travels
        if self.board is None:
            self.end_run(stall_message({self.rank: where}, waited, self.limit, self.setting))
            return
        self.board.post(f"position/{self.rank}", f"{waited:.3f}|{where}")
        self.board.post("stalled", str(self.rank))
        if self.rank != 0:
            if not self._stop.wait(GRACE_S):  # rank 0 ends the run; if it cannot, this rank ends itself
                os._exit(1)
            return
        keys = {f"position/{r}": r for r in range(self.world_size)}
        posted = self.board.wait_for(keys, GATHER_S)
        positions = {r: None for r in range(self.world_size)}
        longest = waited
        for key, value in posted.items():
            seconds, _, at = value.partition("|")
            positions[keys[key]] = at
            longest = max(longest, float(seconds))
        self.end_run(stall_message(positions, longest, self.limit, self.setting))
