"""docs/configs.md: every Hydra config group, option and key, generated from configs/ and kept current."""

from __future__ import annotations

from pathlib import Path

import yaml

from lightning_hybrid.cli.config_reference import config_root, parse, reference

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configs.md"


def keys_of(mapping: dict, prefix: str = "") -> list[str]:
    """The dotted keys of a loaded YAML mapping (a mapping's keys and their nested ones)."""
    keys = []
    for key, value in mapping.items():
        keys.append(prefix + str(key))
        if isinstance(value, dict):
            keys += keys_of(value, prefix + str(key) + ".")
    return keys


def test_the_committed_reference_is_the_generated_one():
    assert PAGE.read_text() == reference(), (
        "docs/configs.md is not what configs/ generates: run `python -m lightning_hybrid.cli.config_reference "
        "docs/configs.md` and commit it"
    )


def test_every_key_of_every_option_is_in_the_reference():
    page = reference()
    root = config_root()
    files = sorted(root.glob("*/**/*.yaml")) + [root / "train.yaml"]  # hydra/launcher/*.yaml included
    assert len(files) > 40 and root / "hydra" / "launcher" / "slurm.yaml" in files
    for path in files:
        group = path.parent.relative_to(root).as_posix()
        title = "### `{}={}`".format(group, path.stem) if path.parent != root else "## The main config"
        start = page.index(title)
        section = page[start : page.find("\n#", start + len(title))]
        loaded = yaml.safe_load(path.read_text()) or {}
        for key in keys_of(loaded):
            assert f"| `{key}` |" in section, f"{path.relative_to(root)}: `{key}` is missing from its reference section"


def test_comments_become_meanings_and_nesting_dotted_keys():
    description, entries = parse(
        "# What this option is.\n# Second line.\n_target_: a.B\n# Above the key.\nalpha: 1\n"
        "beta: [1, 2]  # at the end of the line\noptions:\n  depth: 3  # nested\ndefaults:\n  - one\n  - two\n"
    )
    assert description == "What this option is. Second line."
    got = {e.key: (e.value, e.meaning) for e in entries}
    assert got["alpha"] == ("1", "Above the key.")
    assert got["beta"] == ("[1, 2]", "at the end of the line")
    assert got["options.depth"] == ("3", "nested")
    assert got["defaults"] == ("one, two", "")
