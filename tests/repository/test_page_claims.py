"""What a page names exists in the code: every file path, every config option (``GROUP=OPTION``), every config
key (``GROUP.KEY=...``) and every default a page states for a config key (`` `KEY` (default V) ``,
`` `GROUP.KEY=V` (the default) ``). A page that names something the code lacks fails here, saying where.

The pages: the README, ``docs/`` (but the CHANGELOG's copy: history names what was), the recipes' and the
benchmarks' READMEs, ARCHITECTURE.md. Generated results (``benchmarks/results/``), run folders and paths with
placeholders are not checked.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
PAGES = sorted({ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "benchmarks" / "README.md",
                *ROOT.glob("recipes/**/README.md"), *(ROOT / "docs").rglob("*.md")} - {ROOT / "docs" / "changelog.md"})
#: Config groups whose options and keys the pages are checked against (trainer, callbacks, hydra, logger: Lightning's
#: and Hydra's own arguments; paths: the machine's).
GROUPS = ("strategy", "data", "model", "sim", "optimizer", "scheduler", "experiment")
CODE = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^(?:\./)?((?:lightning_hybrid|tests|benchmarks|configs|docs|tools|recipes|examples|\.ci)/[\w./-]*\w)"
                   r"(?:::(\w+))?(?::\d+(?:-\d+)?)?$")
#: A module named from inside the package, as ARCHITECTURE.md and the strategy pages do (``comm/delayed_allreduce.py``).
PACKAGE_PATH = re.compile(r"^((?:" + "|".join(p.name for p in (ROOT / "lightning_hybrid").iterdir() if p.is_dir()
                                          and not p.name.startswith("_")) + r")/[\w/]+\.py)(?::\s*\w+)?$")
OPTION = re.compile(r"(?:^|\s)(" + "|".join(GROUPS) + r")=(\w+)(?=\s|$)")
KEY = re.compile(r"(?:^|\s)\+{0,2}(" + "|".join(GROUPS) + r")\.(\w+)(?:\.[\w.]+)?=")
DEFAULT = re.compile(r"`(?:(" + "|".join(GROUPS) + r")\.)?(\w+)(?:=([^`\s]+))?` \((?:the )?default(?: (?:is )?`?([\w.+-]+)`?)?\)")
NOT_CHECKED = ("benchmarks/results/", "outputs/", "multirun/", "lightning_hybrid/lightning/")


def claims(kind: re.Pattern[str], in_code: bool = True) -> list[tuple[str, int, re.Match[str]]]:
    """Each match of ``kind`` in the pages' inline code (``in_code``; a quoted message, one with ``->``, left out), or
    in their lines: (page, line, match)."""
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            spans = [c.group(1) for c in CODE.finditer(line) if "->" not in c.group(1)] if in_code else [line]
            found += [(str(page.relative_to(ROOT)), number, m) for span in spans for m in kind.finditer(span)]
    return found


@cache
def options(group: str) -> dict[str, dict]:
    """A config group's options: name -> its keys and values (the file's own, and those of the options it
    lists in ``defaults`` from the same group)."""
    found = {}
    for path in (CONFIGS / group).rglob("*.yaml"):
        name = str(path.relative_to(CONFIGS / group).with_suffix(""))
        found[name] = yaml.safe_load(path.read_text()) or {}
    for name, content in found.items():
        for parent in content.get("defaults", []) if isinstance(content.get("defaults"), list) else []:
            if isinstance(parent, str) and parent in found:
                content.update({k: v for k, v in found[parent].items() if k not in content})
    return found


@cache
def signature_defaults() -> dict[str, list]:
    """The suite's strategies' constructor arguments with a default: name -> their parameters."""
    import inspect

    import lightning_hybrid.strategies as strategies

    found: dict[str, list] = {}
    for name in strategies.__all__:
        for parameter in inspect.signature(getattr(strategies, name)).parameters.values():
            if parameter.default is not inspect.Parameter.empty:
                found.setdefault(parameter.name, []).append(parameter)
    return found


def keys(group: str) -> set[str]:
    return {key for content in options(group).values() for key in content if key != "defaults"}


def test_every_path_a_page_names_exists():
    missing = []
    for page, line, match in claims(PATH):
        path, name = match.group(1), match.group(2)
        if any(path.startswith(skip) for skip in NOT_CHECKED) or "/" not in path.rstrip("/"):
            continue
        target = ROOT / path
        if not target.exists():
            missing.append(f"{page}:{line}: {path}")
        elif name and target.suffix == ".py" and not re.search(rf"^\s*(?:async )?(?:def|class) {name}\b",
                                                               target.read_text(), flags=re.M):
            missing.append(f"{page}:{line}: {path}::{name} (no such test or function)")
    missing += [f"{page}:{line}: {m.group(1)} (lightning_hybrid/{m.group(1)})" for page, line, m in claims(PACKAGE_PATH)
                if not (ROOT / "lightning_hybrid" / m.group(1)).is_file() and not (ROOT / m.group(1)).is_file()]
    assert not missing, "pages name paths the tree lacks:\n" + "\n".join(missing)


def test_every_config_option_a_page_names_exists():
    missing = [f"{page}:{line}: {m.group(1)}={m.group(2)}" for page, line, m in claims(OPTION)
               if m.group(2) not in options(m.group(1)) and m.group(2) not in ("null", "none")]
    assert not missing, "pages name config options configs/ lacks:\n" + "\n".join(missing)


def test_every_config_key_a_page_sets_exists():
    missing = [f"{page}:{line}: {m.group(1)}.{m.group(2)}" for page, line, m in claims(KEY)
               if m.group(2) not in keys(m.group(1)) and not m.group(0).lstrip().startswith("+")]
    assert not missing, "pages set config keys no option of their group has:\n" + "\n".join(missing)


def _same(stated: str, value: object) -> bool:
    text = str(value).lower() if not isinstance(value, bool) else str(value).lower()
    return stated.lower().strip("'\"") in {text, "none" if value is None else text, "null" if value is None else text}


def test_every_default_a_page_states_for_a_config_key_is_the_config_s():
    """`` `strategy.delay=0` (the default) `` and `` `restart_steps` (default 10) `` are read against every option of
    the group that has the key (a key of several strategies may default differently in each: then the page must
    name the group and one of them holds it)."""
    wrong, checked = [], 0
    for page, line, m in claims(DEFAULT, in_code=False):
        group, key, value = m.group(1), m.group(2), m.group(3) or m.group(4)
        if value is None:
            continue
        groups = [group] if group else [g for g in GROUPS if key in keys(g)]
        holders = [content[key] for g in groups for content in options(g).values() if key in content]
        holders += [p.default for p in signature_defaults().get(key, [])] if not group else []
        if not holders:
            continue  # not a config key (a Python argument, a benchmark's option): the docstrings say those
        checked += 1
        if not any(_same(value, held) for held in holders):
            wrong.append(f"{page}:{line}: {key} default {value}, configs have {sorted(map(str, holders))}")
    assert not wrong, "pages state defaults the configs do not have:\n" + "\n".join(wrong)
    assert checked >= 2, checked


@pytest.mark.parametrize("line, check", [
    ("`lightning_hybrid/strategies/no_such.py`", test_every_path_a_page_names_exists),
    ("`strategies/no_such.py`", test_every_path_a_page_names_exists),
    ("`tests/repository/test_page_claims.py::test_no_such_test`", test_every_path_a_page_names_exists),
    ("`strategy=no_such_strategy`", test_every_config_option_a_page_names_exists),
    ("`strategy.no_such_key=1`", test_every_config_key_a_page_sets_exists),
])
def test_a_page_naming_what_the_code_lacks_fails(monkeypatch, line, check):
    def claims_of_one_page(kind: re.Pattern[str]) -> list:
        return [("page.md", 1, m) for code in CODE.finditer(f"A claim: {line}.") for m in kind.finditer(code.group(1))]

    monkeypatch.setattr(f"{__name__}.claims", claims_of_one_page)
    with pytest.raises(AssertionError, match="page.md:1"):
        check()
