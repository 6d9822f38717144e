"""The `lightning-hybrid` commands the README, the docs and the recipes show (shared by the tests that
run them: tests/repository/test_adni_commands.py and tests/repository/test_doc_commands.py)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "recipes").rglob("README.md"))]
#: Commands that do not train: placements, data preparation, explanations, help.
SUBCOMMANDS = ("plan", "data", "explain")


def training_commands() -> list[tuple[str, str]]:
    """(page:line, command) of every `lightning-hybrid` training command shown, the first place each appears
    (continued lines joined; the generated config reference lists keys, not commands)."""
    found: dict[str, str] = {}
    for page in PAGES:
        if page.name == "configs.md":
            continue
        lines = page.read_text().replace("\\\n", " ").splitlines()
        for number, line in enumerate(lines, start=1):
            for match in re.finditer(r"(?:\.venv/bin/)?lightning-hybrid((?: +[^\s`#|]+)*)", line):
                command = " ".join(match.group(1).split())
                first = command.split()[0] if command else ""
                if first in SUBCOMMANDS or first.startswith("--"):
                    continue
                found.setdefault(command, f"{page.relative_to(ROOT)}:{number}")
    return [(where, command) for command, where in found.items()]


def is_adni(command: str) -> bool:
    """A command on ADNI data or a 3D-ResAttNet (tests/repository/test_adni_commands.py runs those)."""
    return bool(re.search(r"adni|resattnet", command))
