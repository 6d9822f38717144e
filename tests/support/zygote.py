"""A pre-imported Python for the tests' script runs: each run is a process forked from it.

Every multi-process test runs a user's script (or the ``lightning-hybrid`` command) in a new
process, and a new interpreter spends about 4 s of CPU importing torch, Lightning and Hydra before
the script's first line: most of such a test on the 2-core CI machine. This zygote imports them
once per pytest worker; each run is then a child forked from it that takes the run's command line,
environment, working directory and output files, and runs the script as ``python script.py ...``
(or ``python -m module ...``) would. The child is a process of its own with a fresh ``__main__``;
what it starts (ranks, the parameter server) are ordinary new processes. Set
``LIGHTNING_HYBRID_TESTS_FRESH_PYTHON=1`` to run every script in a new interpreter instead.

Protocol (JSON lines): the client sends ``{"argv", "env", "cwd", "stdout", "stderr"}`` (``argv`` as
after ``python``: ``["script.py", ...]`` or ``["-m", "module", ...]``; output file paths, or a terminal's
device), optionally ``"stdin"`` (a path; /dev/null without it) and ``"new_session": true`` (the child
calls ``setsid()``, as ``subprocess.Popen(start_new_session=True)`` does); the zygote answers
``{"id", "pid"}`` when the child runs (``id``: the request's, where it has one) and ``{"pid",
"returncode"}`` when it ends. Several runs may be under
way at once (the tasks of one job): a request is read while earlier children still run.
"""

from __future__ import annotations

import json
import os
import runpy
import select
import sys
import warnings


def _run_child(request: dict) -> None:
    """In the forked child: become the requested ``python ...`` run; never returns."""
    if request.get("new_session"):
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    stdin = os.open(request.get("stdin") or os.devnull, os.O_RDONLY | os.O_NOCTTY)
    os.dup2(stdin, 0)
    os.close(stdin)
    opened: dict[str, int] = {}  # one open file for both where they are the same (stderr=STDOUT)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        if path not in opened:
            # a terminal's device (a test's pseudo-terminal) is opened as it is, without becoming the child's
            # controlling terminal (as Popen passing the terminal's descriptors); a file is truncated
            flags = os.O_WRONLY | os.O_NOCTTY | (0 if path.startswith("/dev/") else os.O_CREAT | os.O_TRUNC)
            opened[path] = os.open(path, flags, 0o644)
        os.dup2(opened[path], fd)
    for out in opened.values():
        os.close(out)
    if os.isatty(1):  # as a new interpreter would buffer a terminal's output: line by line
        sys.stdout.reconfigure(line_buffering=True)
    if "torch.distributed" in sys.modules:  # read when torch was imported: this run's setting instead
        sys.modules["torch.distributed"].set_debug_level_from_env()
    if "ignore" in request["env"].get("PYTHONWARNINGS", "").split(","):
        warnings.simplefilter("ignore")
    argv = request["argv"]
    # As ``python`` would: PYTHONPATH's folders after the script's own.
    sys.path[1:1] = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    # An exception or SystemExit raised by the script ends this child as it would end ``python``
    # (the traceback or message printed, its exit code); a script that returns exits with 0.
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = request["cwd"]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")
    sys.exit(0)


def serve() -> None:
    requests = os.dup(0)
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # nothing printed by accident can corrupt the replies

    def reply(message: dict) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    running: set[int] = set()
    pending = b""
    while True:
        # while children run, wake up often enough to report each one's end within 20 ms
        ready, _, _ = select.select([requests], [], [], 0.02 if running else None)
        if ready:
            data = os.read(requests, 1 << 20)
            if not data:
                return  # the pytest worker is gone
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    os.close(requests)
                    replies.close()
                    _run_child(request)
                running.add(pid)
                reply({"id": request.get("id"), "pid": pid})
        for pid in list(running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                running.discard(pid)
                reply({"pid": pid, "returncode": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    # What every run would import: torch, Lightning (through the package), Hydra. Nothing is
    # computed here: a fork must not inherit started thread pools.
    import hydra  # noqa: F401
    import pytorch_lightning  # noqa: F401

    import lightning_hybrid  # noqa: F401
    import lightning_hybrid.cli  # noqa: F401

    # The imported objects are permanent: out of the collector's reach, a child's first full collection
    # does not walk (and copy, page by page) the whole inherited heap in the middle of a timed step,
    # which a fresh interpreter never does (measured: 0.25 s in one step of a balanced test's rank).
    import gc

    gc.freeze()
    serve()
