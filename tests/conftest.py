"""Shared fixtures: tiny generated MNIST files, the real MNIST folder when present, and a CLI runner."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import multiprocessing
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch

from lightning_hybrid.data.idx import write_idx
from lightning_hybrid.strategies.forked_ranks import ForkedProcess

# tests/ mirrors the package's folders; the helpers and the scripts the tests run are in tests/support/,
# importable by every test module (and by the scripts themselves: a script's own folder comes first).
SUPPORT = Path(__file__).resolve().with_name("support")
sys.path.insert(0, str(SUPPORT))

from threads import threads_per_process  # noqa: E402

# Tests that start processes with multiprocessing use "forkserver": each process is forked from a
# server that has imported these once (a "spawn" would import torch and Lightning again, 4 s of CPU).
multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "pytorch_lightning", "lightning_hybrid"])

# The tests that train in the pytest worker itself share the cores with the other workers' tests.
torch.set_num_threads(threads_per_process(1))

REPO = Path(__file__).resolve().parents[1]
REAL_MNIST = REPO.parent / "shared" / "data" / "mnist"

# Every process group of the tests checks that its ranks issue the same collectives, with the same
# shapes (gloo: torch's ProcessGroupWrapper), so that a desynchronised run fails at once, naming the
# mismatch, instead of hanging until a timeout. collective_check/sitecustomize.py, loaded by every
# Python the tests start, keeps Lightning's DDPStrategy from crashing under it (see there).
COLLECTIVE_CHECK = SUPPORT / "collective_check"
os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(COLLECTIVE_CHECK), os.environ.get("PYTHONPATH")) if p)
torch.distributed.set_debug_level_from_env()


@pytest.fixture
def real_mnist() -> Path:
    """The real MNIST files of ../shared/data/mnist; the test is skipped when they are absent."""
    if not (REAL_MNIST / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST files not found in {REAL_MNIST} (a fresh clone has no ../shared); skipping")
    return REAL_MNIST


def write_tiny_mnist(folder: Path, n_train: int = 120, n_test: int = 40, seed: int = 0) -> dict[str, str]:
    """Write the four MNIST files with ``n_train``/``n_test`` random 28x28 images; return their md5s."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train-images-idx3-ubyte.gz": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte.gz": (np.arange(n_train) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte.gz": (np.arange(n_test) % 10).astype(np.uint8),
    }
    for name, array in arrays.items():
        write_idx(folder / name, array)
    return {name: hashlib.md5((folder / name).read_bytes()).hexdigest() for name in arrays}


@pytest.fixture
def tiny_mnist(tmp_path: Path) -> Path:
    folder = tmp_path / "mnist"
    write_tiny_mnist(folder)
    return folder


TRAIN_SCRIPT = SUPPORT / "train_script.py"
#: The reference setting the equivalence tests share (2 processes of batch 16, 3 epochs, SGD with momentum).
REFERENCE = ("--devices", "2", "--batch-size", "16", "--epochs", "3", "--lr", "0.05", "--momentum", "0.9")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the variables that would make a started script think it
    is a rank of a run already (pytest-xdist workers may carry them), plus ``extra``."""
    drop = ("LOCAL_RANK", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK")
    env = {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}
    if "PYTHONPATH" in extra:  # the collective check's folder stays first
        env["PYTHONPATH"] = os.pathsep.join((str(COLLECTIVE_CHECK), extra["PYTHONPATH"]))
    return env


class ZygoteProcess(ForkedProcess):
    """A run started by :meth:`Zygote.start`: a forked child of the zygote, not of this process, so its end
    is learnt from the zygote's replies rather than ``waitpid``; its output went to the files (or the
    terminal) it was started with."""

    def __init__(self, pid: int, args: list[str]) -> None:
        super().__init__(pid)
        self.args = args

    def poll(self) -> int | None:
        if self.returncode is None:
            Zygote._read_replies(0)
            self.returncode = Zygote._ended.pop(self.pid, None)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            Zygote._read_replies(left)
        return self.returncode


class Zygote:
    """Client of ``tests/support/zygote.py``: runs ``python ARGV`` as a process forked from a Python that has
    already imported torch, Lightning and Hydra (started once per pytest worker), returning what
    :func:`subprocess.run` with ``capture_output=True, text=True`` would (:meth:`run`), or, started
    with its output in files or a terminal, a process to wait for (:meth:`start`: several at once, as
    the tasks of one job). A new interpreter per run instead with ``LIGHTNING_HYBRID_TESTS_FRESH_PYTHON=1``."""

    _process: subprocess.Popen | None = None
    _replies = b""
    _requests = 0  # requests sent: each one's id
    _started: dict[int, int] = {}  # request id -> pid, announced and not yet taken by start()
    _ended: dict[int, int] = {}  # pid -> return code, of runs that ended and were not yet polled

    @classmethod
    def _read_replies(cls, timeout: float | None) -> None:
        """Read what the zygote has answered, waiting up to ``timeout`` seconds for a first answer."""
        fd = cls._process.stdout.fileno()
        while True:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return
            data = os.read(fd, 65536)
            if not data:
                raise RuntimeError(f"the zygote (tests/support/zygote.py) ended with {cls._process.wait()}")
            cls._replies += data
            while b"\n" in cls._replies:
                line, cls._replies = cls._replies.split(b"\n", 1)
                reply = json.loads(line)
                if "returncode" in reply:
                    cls._ended[reply["pid"]] = reply["returncode"]
                else:
                    cls._started[reply["id"]] = reply["pid"]
            timeout = 0  # and whatever else is there already

    @classmethod
    def start(cls, argv: list[str], env: dict[str, str], cwd: Path, stdout: str | Path, stderr: str | Path,
              stdin: str | Path | None = None, new_session: bool = False,
              fresh: bool = False) -> ZygoteProcess | subprocess.Popen:
        """Start ``python ARGV`` with its standard output and error into the files (or terminal device)
        ``stdout`` and ``stderr`` (one file for both where they are the same path) and its input from
        ``stdin`` (/dev/null without it), in a session of its own with ``new_session`` (as
        ``subprocess.Popen(start_new_session=True)``); don't wait. ``fresh``: in a new interpreter."""
        command = [sys.executable, *argv]
        if fresh or os.environ.get("LIGHTNING_HYBRID_TESTS_FRESH_PYTHON") == "1":
            def opened(path: str | Path) -> int:  # as the zygote opens them
                device = str(path).startswith("/dev/")
                return os.open(path, os.O_WRONLY | os.O_NOCTTY | (0 if device else os.O_CREAT | os.O_TRUNC), 0o644)

            out = opened(stdout)
            fds = [os.open(stdin or os.devnull, os.O_RDONLY | os.O_NOCTTY), out,
                   os.dup(out) if str(stderr) == str(stdout) else opened(stderr)]
            try:
                return subprocess.Popen(command, env=env, cwd=cwd, stdin=fds[0], stdout=fds[1], stderr=fds[2],
                                        start_new_session=new_session)
            finally:
                for fd in fds:
                    os.close(fd)
        if cls._process is None or cls._process.poll() is not None:
            cls._process = subprocess.Popen(
                [sys.executable, str(SUPPORT / "zygote.py")], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, env=clean_env(),
            )
            cls._replies, cls._started, cls._ended = b"", {}, {}
        # Each answer names its request or process: a run that a test left waiting (pytest-timeout's
        # exception, a failure) cannot hand its answers to the next runs.
        cls._requests += 1
        request = {"id": cls._requests, "argv": argv, "env": env, "cwd": str(cwd), "stdout": str(stdout),
                   "stderr": str(stderr), "stdin": str(stdin) if stdin else None, "new_session": new_session}
        cls._process.stdin.write((json.dumps(request) + "\n").encode())
        cls._process.stdin.flush()
        while cls._requests not in cls._started:
            cls._read_replies(None)
        return ZygoteProcess(cls._started.pop(cls._requests), command)

    @classmethod
    def run(cls, argv: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
        command = [sys.executable, *argv]
        if os.environ.get("LIGHTNING_HYBRID_TESTS_FRESH_PYTHON") == "1":
            return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            process = cls.start(argv, env, cwd, out, err)
            try:
                returncode = process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise subprocess.TimeoutExpired(command, timeout, output=out.read_text(), stderr=err.read_text())
            except BaseException:  # the test is stopped (pytest-timeout, Ctrl+C): so is its run
                process.kill()
                raise
            return subprocess.CompletedProcess(command, returncode, out.read_text(), err.read_text())


def run_script(
    script: Path, out: Path, *args: str, timeout: float = 240, check: bool = True, fork_ranks: bool = True
) -> subprocess.CompletedProcess:
    """Run one of the tests' user scripts (each builds its own Trainer) writing into ``out``; fail the
    test when it fails (unless ``check=False``). Our strategies fork their other ranks
    (``--fork-ranks``: no second import of torch and Lightning, 4 s of CPU per rank) unless
    ``fork_ranks=False`` asks for Lightning's default, each rank running the script anew."""
    out.mkdir(parents=True, exist_ok=True)
    env = clean_env()
    argv = [str(script), str(out), *args, *(["--fork-ranks"] if fork_ranks else [])]
    proc = Zygote.run(argv, env, Path.cwd(), timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"{script.name} {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-6000:]}")
    return proc


def run_train_script(out: Path, *args: str, **kwargs: Any) -> subprocess.CompletedProcess:
    """:func:`run_script` of tests/support/train_script.py (a user's script training a small classifier)."""
    return run_script(TRAIN_SCRIPT, out, *args, **kwargs)


def shared_folder(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Any]) -> Path:
    """The folder ``name`` that ``make(folder)`` fills, made once per test session for all the tests and
    pytest-xdist workers that read it (a module-scoped fixture is made again in each worker that runs
    one of the module's tests; here the second waits for the first's)."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared_runs"
    shared.mkdir(parents=True, exist_ok=True)
    out = shared / name
    with FileLock(str(out) + ".lock"):
        if not (shared / f"{name}.done").exists():
            shutil.rmtree(out, ignore_errors=True)  # what a worker that failed to make it left
            make(out)
            (shared / f"{name}.done").touch()
    return out


def shared_train_script(tmp_path_factory: pytest.TempPathFactory, *args: str) -> Path:
    """The output folder of ``train_script.py *args``, run once per test session for all the tests
    (and pytest-xdist workers) that compare against the same reference run."""
    return shared_folder(tmp_path_factory, hashlib.md5(" ".join(args).encode()).hexdigest(),
                         lambda out: run_train_script(out, *args))


def free_port() -> int:
    """A TCP port free on this machine now (for a rendezvous the test sets up itself)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (Linux /proc; a zombie counts as dead)."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def run_cli(*overrides: str, cwd: Path, timeout: float = 240, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -m lightning_hybrid.cli`` with overrides in ``cwd``; fail the test on timeout."""
    env = clean_env(HYDRA_FULL_ERROR="0", PYTHONWARNINGS="ignore")
    proc = Zygote.run(
        ["-m", "lightning_hybrid.cli", *overrides, "trainer.enable_progress_bar=false",
         f"cpu_threads_per_process={threads_per_process(2)}"],
        env, cwd, timeout,
    )
    if check and proc.returncode != 0:
        pytest.fail(f"lightning-hybrid {' '.join(overrides)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


#: Single-process tests that take as long as the multi-process ones (seconds of training or search).
LONG_TESTS = ("test_gabra_within_one_percent_of_exact", "test_training_beats_chance_on_held_out_subjects",
              "test_slowdown_stretches_the_step_time_by_its_factor")


def pytest_collection_modifyitems(config, items) -> None:
    """Long tests first (the multi-process ones, the CLI's and :data:`LONG_TESTS`), so that pytest-xdist's
    workers end together on short ones instead of one worker finishing a long test alone."""
    def long(item) -> bool:
        return (item.get_closest_marker("multiprocess") is not None or item.name.startswith(LONG_TESTS)
                or item.path.name == "test_cli.py")  # each CLI test runs the command in a process of its own

    items.sort(key=lambda item: not long(item))


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: two test processes on a 2-core machine (the multi-process tests idle while their
    processes start and wait for each other), at most four on a large one (each test starts up to four
    processes of its own, with one torch thread per core they get)."""
    return max(2, min(4, (os.cpu_count() or 1) // 4))


@pytest.fixture(scope="session")
def check_site():
    """tools/check_site.py as a module (its ``main(argv)`` checks a built site in headless Chromium);
    the test skips, saying why, where no Chromium is installed."""
    if not any(shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")):
        pytest.skip("no Chromium on this machine (apt-get install chromium); the site check needs it")
    spec = importlib.util.spec_from_file_location("check_site", REPO / "tools" / "check_site.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
