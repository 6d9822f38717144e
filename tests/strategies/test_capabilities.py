"""The strategy contract: every capability callers ask of a strategy is named in one place, with its default for
any other strategy, and nobody probes a strategy for one with hasattr or getattr."""

from __future__ import annotations

import re
from pathlib import Path

from pytorch_lightning.strategies import DDPStrategy

from lightning_hybrid import BalancedDataParallelStrategy, HybridParallelStrategy, SSPStrategy
from lightning_hybrid.strategies.capabilities import Capabilities, capabilities_of

PACKAGE = Path(__file__).resolve().parents[2] / "lightning_hybrid"
NAMES = [n for n in vars(Capabilities) if not n.startswith("_")]


def test_any_strategy_answers_with_the_defaults_and_ours_with_their_own():
    ddp = capabilities_of(DDPStrategy())
    assert (ddp.resumes_mid_epoch, ddp.logs_peak_memory, ddp.slows_its_compute, ddp.rank_exit_watch) == (True, False, False, None)
    ddp.check_evaluation(None, None)  # nothing to refuse
    assert capabilities_of(BalancedDataParallelStrategy()).slows_its_compute
    assert not capabilities_of(SSPStrategy()).resumes_mid_epoch
    assert capabilities_of(HybridParallelStrategy()).logs_peak_memory


def test_no_caller_probes_a_strategy_for_a_capability():
    probe = re.compile(r"(hasattr|getattr)\([^)]*strategy[^)]*[\"'](" + "|".join(NAMES) + r")[\"']")
    found = [f"{path.relative_to(PACKAGE)}: {line.strip()}" for path in PACKAGE.rglob("*.py")
             for line in path.read_text().splitlines() if probe.search(line)]
    assert not found, found
