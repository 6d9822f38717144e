"""A pre-imported Python for the tests' script runs: each run is a process forked from it.

Every multi-process test runs a user's script (or the ``lightning-hybrid`` command) in a new
process, and a new interpreter spends about 4 s of CPU importing torch, Lightning and Hydra before
the script's first line: most of such a test on the 2-core CI machine. This zygote imports them
once per pytest worker; each run is then a child forked from it that takes the run's command line,
environment, working directory and output files, and runs the script as ``python script.py ...``
(or ``python -m module ...``) would. The child is a process of its own with a fresh ``__main__``;
what it starts (ranks, the parameter server) are ordinary new processes. Set
``LIGHTNING_HYBRID_TESTS_FRESH_PYTHON=1`` to run every script in a new interpreter instead.

Protocol (one run at a time, JSON lines): the client sends ``{"argv", "env", "cwd", "stdout",
"stderr"}`` (``argv`` as after ``python``: ``["script.py", ...]`` or ``["-m", "module", ...]``; output
file paths); the zygote answers ``{"pid"}`` when the child runs and ``{"returncode"}`` when it ends.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import warnings


def _run_child(request: dict) -> None:
    """In the forked child: become the requested ``python ...`` run; never returns."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
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
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # nothing printed by accident can corrupt the replies
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            requests.close()
            replies.close()
            _run_child(request)
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        replies.flush()


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
