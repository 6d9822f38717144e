"""Packaging: every subpackage ships, torchvision is never needed, CI runs the README's test command."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_pyproject_lists_every_subpackage():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "lightning_hybrid").rglob("__init__.py")
    } | {"lightning_hybrid.configs"}
    assert listed == found


def test_nothing_requires_torchvision():
    code = (
        "import sys; sys.modules['torchvision'] = None\n"  # any `import torchvision` now fails
        "import lightning_hybrid, lightning_hybrid.cli, lightning_hybrid.data, lightning_hybrid.models, lightning_hybrid.sim\n"
        "from lightning_hybrid.data import MNISTDataModule, SyntheticMNISTDataModule\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def readme_commands() -> list[str]:
    readme = (REPO / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    return [line for line in first_block.splitlines() if line and not line.startswith("#")]


def test_readme_starts_with_the_two_commands_and_ci_runs_the_test_one():
    run_job, run_tests = readme_commands()
    assert "lightning-hybrid" in run_job and "pip install" in run_job
    assert "pytest" in run_tests and "pip install" in run_tests and ".[test]" in run_tests
    ci = (REPO / ".ci" / "run").read_text()
    assert "README.md" in ci and "pytest" in ci


def test_console_entry_point_exists():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, func = scripts["lightning-hybrid"].partition(":")
    mod = __import__(module, fromlist=[func])
    assert callable(getattr(mod, func))
