"""One line for the user, wherever the code runs.

Under the command line Hydra has configured logging, and a line goes through the module's logger (to the
console and the run's log file). In a plain script, or a process started by ``multiprocessing`` (Lightning's
``ddp_spawn``), nothing has configured it and Python drops INFO lines: the line goes to standard error.
"""

from __future__ import annotations

import logging
import sys


def say(log: logging.Logger, line: str) -> None:
    """``log.info(line)`` where logging has a handler for ``log``; otherwise ``line`` on standard error."""
    if log.hasHandlers():
        log.info(line)
    else:
        print(line, file=sys.stderr, flush=True)
