# Generated from lightning_hybrid/cli/config_reference.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""The reference of every Hydra config group, option and key, generated from the configs themselves.

Each config file says what its keys mean in comments: a comment at the end of a key's line, or the
comment lines just above it; the comment lines at the top of a file say what the option is. This
module reads keys, values and comments line by line (the configs' plain YAML subset) and writes one
Markdown page: a section per group, a table per option (key, default, meaning). The committed page
is `docs/configs.md`; a test regenerates it and fails when it differs, so an option added to
`configs/` without its reference, or with the reference left stale, does not land.

    python -m lightning_hybrid.lightning.cli.config_reference docs/configs.md   # rewrite the page
    python -m lightning_hybrid.lightning.cli.config_reference                   # print it
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

#: The groups in the order a newcomer meets them; any other group follows, alphabetically.
GROUP_ORDER = ("strategy", "trainer", "data", "model", "optimizer", "scheduler", "sim", "callbacks", "logger",
               "experiment", "paths", "hydra")
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w.]*):(?P<value>[^#]*?)\s*(?:#\s?(?P<comment>.*))?$")


@dataclass(frozen=True)
class Entry:
    """A key of a config file: its dotted path, its value as written, what its comments say."""

    key: str
    value: str
    meaning: str


def config_root() -> Path:
    """The folder of the configs (``configs/``, shipped as ``lightning_hybrid.configs``)."""
    return Path(str(resources.files("lightning_hybrid.configs")))


def parse(text: str) -> tuple[str, list[Entry]]:
    """The description at the top of a config file, and its keys (nested ones dotted) with their
    values and meanings. List items (a ``defaults`` list) are joined into their key's value."""
    lines = text.splitlines()
    header: list[str] = []
    index = 0
    while index < len(lines) and lines[index].startswith("#"):
        header.append(lines[index].lstrip("#").strip())
        index += 1
    entries: list[Entry] = []
    pending: list[str] = []  # comment lines just above the next key
    parents: list[tuple[int, str]] = []  # (indent, key) of the mappings the next key may be inside
    for line in lines[index:]:
        stripped = line.strip()
        if not stripped:
            pending = []
            continue
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        if stripped.startswith("- "):  # an item of the last key's list
            if entries:
                last = entries[-1]
                item = stripped[2:].split("#", 1)[0].strip()
                entries[-1] = Entry(last.key, f"{last.value}, {item}" if last.value else item, last.meaning)
            continue
        match = _KEY.match(line)
        if match is None:
            continue
        indent = len(match["indent"])
        while parents and parents[-1][0] >= indent:
            parents.pop()
        key = ".".join([*(k for _, k in parents), match["key"]])
        value = match["value"].strip()
        meaning = (match["comment"] or "").strip() or " ".join(pending)
        entries.append(Entry(key, value, meaning))
        if not value:  # a mapping or a list follows
            parents.append((indent, match["key"]))
        pending = []
    return " ".join(header), entries


def _cell(text: str) -> str:
    return text.replace("|", "\\|") if text else ""


def reference(root: Path | None = None) -> str:
    """The Markdown reference of every group, option and key under ``root`` (the package's configs)."""
    root = root or config_root()
    out = [
        "# Config reference",
        "",
        "Every Hydra config group of `lightning-hybrid`, each option of it (`GROUP=OPTION` on the command",
        "line) and each key (`GROUP.KEY=VALUE`), with its default and what it means. Generated from the",
        "comments in `configs/` by `python -m lightning_hybrid.lightning.cli.config_reference docs/configs.md`; do not",
        "edit by hand.",
        "",
    ]
    main = root / "train.yaml"
    if main.exists():
        out += _option_section("The main config (`train.yaml`)", main, level="##")
    # A group's folders are groups too (hydra/launcher), each after its parent.
    groups = sorted((p.relative_to(root) for p in root.rglob("*") if p.is_dir()
                     and not any(part.startswith(("_", ".")) for part in p.relative_to(root).parts)),
                    key=lambda g: (GROUP_ORDER.index(g.parts[0]) if g.parts[0] in GROUP_ORDER else len(GROUP_ORDER), g.parts))
    for group in groups:
        name = group.as_posix()
        out += [f"## `{name}`", ""]
        for path in sorted((root / group).glob("*.yaml")):
            out += _option_section(f"`{name}={path.stem}`", path, level="###")
    return "\n".join(out).rstrip() + "\n"


def _option_section(title: str, path: Path, level: str) -> list[str]:
    description, entries = parse(path.read_text())
    lines = [f"{level} {title}", ""]
    if description:
        lines += [description, ""]
    if entries:
        lines += ["| key | default | meaning |", "|---|---|---|"]
        lines += [f"| `{e.key}` | {f'`{_cell(e.value)}`' if e.value else ''} | {_cell(e.meaning)} |" for e in entries]
        lines.append("")
    return lines


def main() -> None:
    text = reference()
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
