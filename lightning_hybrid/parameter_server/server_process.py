"""The parameter server's process: started from a worker (:func:`start_server`), named (``ps``/``top`` show
``lh-param-server``), deaf to the signals the workers handle, gone when the process that started it is, and
serving :class:`~lightning_hybrid.parameter_server.server.ParameterServer` until ``Shutdown``."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from lightning_hybrid.comm.board import connect_store
from lightning_hybrid.parameter_server import channel
from lightning_hybrid.parameter_server.average_clip import ShardNorms
from lightning_hybrid.parameter_server.protocol import ServerSettings, wire_dtype
from lightning_hybrid.parameter_server.server import ParameterServer
from lightning_hybrid.parameter_server.update_rule import UpdateRule

log = logging.getLogger(__name__)


# The server needs torch only. Importing ``lightning_hybrid`` runs the package's __init__, which
# imports Lightning to register the strategies (2-3 s of CPU per process); the server process stands
# in an empty package object for it and imports its own modules from the package folder.
_LAUNCH = (
    "import sys, types\n"
    "package = types.ModuleType('lightning_hybrid')\n"
    "package.__path__ = [sys.argv[1]]\n"
    "sys.modules['lightning_hybrid'] = package\n"
    "from lightning_hybrid.parameter_server.server_process import main\n"
    "main()\n"
)


def start_server(settings: ServerSettings) -> subprocess.Popen:
    """Start the server process for ``settings`` (it exits when this process dies)."""
    package_dir = str(Path(__file__).resolve().parents[1])
    process = subprocess.Popen([sys.executable, "-c", _LAUNCH, package_dir], stdin=subprocess.PIPE, text=True)
    process.stdin.write(settings.to_json())
    process.stdin.close()
    return process


def _exit_when_orphaned(parent_pid: int, period: float = 1.0) -> None:
    def watch() -> None:
        while True:
            time.sleep(period)
            if os.getppid() != parent_pid:
                log.error("parameter server: the process that started it (pid %d) is gone; exiting", parent_pid)
                os._exit(3)

    threading.Thread(target=watch, daemon=True, name="ps-orphan-watch").start()


#: Signals the server leaves to the workers: Ctrl+C reaches every process of the terminal's group, a
#: scheduler's SIGTERM and SLURM's requeue signal every process of the job; the workers stop the run
#: (saving what they must) and end the server, which dies with the process that started it anyway.
LEFT_TO_THE_WORKERS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


def main() -> None:
    """The server process: settings from standard input, then serve until ``Shutdown``."""
    run(ServerSettings.from_json(sys.stdin.read()))


#: The server process's name (Linux: what ``ps -o comm``, ``top`` and /proc/PID/comm show).
PROCESS_NAME = "lh-param-server"


def _name_this_process(name: str) -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def run(settings: ServerSettings) -> None:
    """Be the server of ``settings`` in this process until ``Shutdown``, then exit it (code 0)."""
    _name_this_process(PROCESS_NAME if settings.shards == 1 else f"{PROCESS_NAME[:12]}-{settings.shard}")
    for signum in LEFT_TO_THE_WORKERS:  # also the handlers a server forked from a worker inherited
        signal.signal(signum, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format=f"[{settings.name}] %(message)s", stream=sys.stderr, force=True)
    _exit_when_orphaned(os.getppid())
    torch.set_num_threads(1)
    pg = channel.open_channel(settings.host, settings.port, settings.prefix, 0, settings.workers + 1, settings.timeout)
    rule = UpdateRule(settings.pushes_per_update, settings.staleness_lr, settings.momentum_correction,
                      restart_steps=settings.restart_steps)
    norms = None
    if settings.shards > 1:  # a clipped step's gradient norm spans the shards: they meet on the run's store
        norms = ShardNorms(connect_store(settings.host, settings.port, settings.timeout), settings.shard, settings.shards,
                           settings.run_prefix, settings.timeout)
    ParameterServer(pg, settings.workers, settings.staleness, settings.sync, rule, settings.max_steps,
                    settings.step_patience, settings.on_worker_failure, settings.pushes_follow_workers,
                    settings.batch_mode, settings.num_params, wire_dtype(settings.wire_dtype),
                    settings.server_device, norms).serve()
    # Shut down: nothing is left to clean up, and a normal interpreter exit with the channel's
    # receive threads still blocked in gloo aborts ("terminate called without an active exception").
    logging.shutdown()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
