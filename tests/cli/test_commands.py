"""What users type: every training alias through the installed ``lightning-hybrid`` command, 2 ranks,
2 short epochs, as a batch job runs it (output to a file: the log-line progress) and in a terminal
(a pseudo-terminal: Lightning's progress bar). Each run has a hard time limit; a run past it fails the
test with every process's Python stack (py-spy), so a hang is reported where it happens.

Ranks are started as users' runs start them: on this CPU machine the suite's strategies fork rank 1 at fit
(``fork_ranks: auto``), Lightning's ``ddp`` reruns the command for it, ``ddp_spawn`` spawns both.

The command runs in a new interpreter, as a shell starts it, for :data:`FRESH` (Lightning's ``ddp``
in a batch job and in a terminal, and ``ssp_delay``, with its parameter server, in a batch job); every
other run is the same script (the installed ``lightning-hybrid``) with the same command line,
environment, working directory, output and session, forked from the tests' Python that has already
imported torch, Lightning and Hydra (tests/support/zygote.py): about 10 s of CPU less each, on 2 cores."""

from __future__ import annotations

import fcntl
import os
import pty
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from command_aliases import ALIASES
from conftest import Zygote, clean_env

from lightning_hybrid.deprecation import RENAMED_OPTIONS

pytestmark = pytest.mark.multiprocess

COMMAND = Path(sys.executable).with_name("lightning-hybrid")
#: The other strategies of the command line (its configs), in a batch job only: the terminal's progress bar
#: is the same code under every strategy.
CONFIGS = ("ddp_bf16", "ddp_powersgd", "ddp_spawn", "fsdp2", "fsdp2_shard_grad_op")
#: A few batches of MNIST-shaped synthetic data (no download), two epochs: the epoch's end, where the
#: metrics are synchronised and checkpoints written, is met twice.
SMALL = ("trainer.max_epochs=2", "trainer.limit_train_batches=4", "trainer.limit_val_batches=2",
         "trainer.limit_test_batches=2", "data=synthetic", "data.num_train=512", "data.num_val=128", "data.num_test=128")
LIMIT_S = 150
#: (alias, output) run in a new interpreter; the others are forked from tests/support/zygote.py.
FRESH = {("ddp", "file"), ("ddp", "terminal"), ("ssp_delay", "file")}


def stacks(group: int) -> str:
    """Every process of the process group ``group``: its command and Python stack (py-spy, where installed)."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    pids = subprocess.run(["ps", "-o", "pid=", "-g", str(group)], capture_output=True, text=True).stdout.split()
    if spy is None:
        return f"(py-spy is not installed: no stacks) processes {pids}"
    dumps = [subprocess.run([spy, "dump", "--pid", pid], capture_output=True, text=True, timeout=30).stdout
             for pid in pids]
    return "\n".join(dumps)


def run_command(args: list[str], cwd: Path, terminal: bool, fresh: bool = True) -> tuple[int, str]:
    """``lightning-hybrid *args`` in a session of its own, its output to a file or a pseudo-terminal, in a
    new interpreter (``fresh``) or forked from tests/support/zygote.py; past :data:`LIMIT_S` the test fails with
    every process's stack."""
    env = clean_env(PYTHONWARNINGS="ignore")
    env.pop("TORCH_DISTRIBUTED_DEBUG")  # as users run it (the suite's other runs check the collectives)
    chunks: list[bytes] = []
    if terminal:
        controller, child_end = pty.openpty()
        fcntl.ioctl(child_end, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # a terminal's size: the bar's width
        terminal_device = os.ttyname(child_end)
        process = Zygote.start([str(COMMAND), *args], env, cwd, terminal_device, terminal_device, stdin=terminal_device,
                               new_session=True, fresh=fresh)

        def drain() -> None:  # a full terminal buffer would block the writer
            while True:
                try:
                    data = os.read(controller, 65536)
                except OSError:  # no process holds the terminal open any more
                    return
                if not data:
                    return
                chunks.append(data)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
    else:
        process = Zygote.start([str(COMMAND), *args], env, cwd, cwd / "out.log", cwd / "out.log", new_session=True,
                               fresh=fresh)
    stuck = None
    try:
        process.wait(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        stuck = stacks(process.pid)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    finally:
        if terminal:
            # held until the command ends (a forked run opens the terminal after it starts): then the
            # reader's next read says that nobody writes any more
            os.close(child_end)
            reader.join(timeout=10)
            os.close(controller)
    output = b"".join(chunks).decode(errors="replace") if terminal else (cwd / "out.log").read_text(errors="replace")
    if stuck is not None:
        pytest.fail(f"lightning-hybrid {' '.join(args)} did not end within {LIMIT_S} s; last output:\n{output[-2000:]}\n"
                    f"stacks:\n{stuck}")
    return process.returncode, output


@pytest.mark.skipif(not COMMAND.is_file(), reason=f"the lightning-hybrid command is not installed beside {sys.executable}")
@pytest.mark.parametrize("alias, output", [(alias, output) for alias in ALIASES for output in ("file", "terminal")]
                         + [(config, "file") for config in CONFIGS])
def test_every_alias_finishes_as_users_type_it(tmp_path, alias, output):
    returncode, text = run_command([f"strategy={alias}", "trainer.devices=2", *SMALL, f"hydra.run.dir={tmp_path / 'run'}"],
                                   tmp_path, terminal=output == "terminal", fresh=(alias, output) in FRESH)
    assert returncode == 0, f"exit status {returncode}:\n{text[-4000:]}"
    assert text.count("final metrics") == 1 and "test/acc" in text, "rank 0 reports, once:\n" + text[-3000:]
    if alias == "ddp":  # Lightning's DDPStrategy: rank 1 reruns the command, in the same run folder
        assert (tmp_path / "run" / "train_ddp_process_1.log").is_file(), "rank 1 reran the command in the same run folder"
    elif alias != "ddp_spawn":  # the suite's strategies on CPU (fork_ranks: auto): rank 1 forked at fit
        assert "GLOBAL_RANK: 1, MEMBER: 2/2" in text and not (tmp_path / "run" / "train_ddp_process_1.log").exists(), text[-3000:]
    if output == "file":
        assert "epoch 2/2  done" in text, "the log-line progress at each epoch's end"
    else:
        assert "Epoch 1:" in text and "it/s]" in text, "Lightning's progress bar"


def test_every_training_strategy_of_the_command_line_is_run_above():
    configs = {path.stem for path in (Path(__file__).parents[2] / "configs" / "strategy").glob("*.yaml")}
    not_training = {"single", "partitioned_inference"}  # one process; prediction (tests/strategies/test_partitioned_inference.py)
    renamed = set(RENAMED_OPTIONS["strategy"])  # compose as their new names (tests/test_deprecation.py)
    assert configs - not_training - renamed == set(ALIASES) | set(CONFIGS), "a strategy config neither run nor exempted"
