"""Every value a shipped stack file sets says where it comes from: a seed line on its own line
(`# seed 000:17`), or an entry in docs/engines.md's list of the values not taken from the seeds,
whose keys column names them (as patterns, for the stacks of its row). Names, descriptions,
`extends` and the known issues (each cites its own `source:`) are the file's own."""

from __future__ import annotations

import re
from fnmatch import fnmatch
from pathlib import Path

import pytest
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[2]
STACKS = sorted(p for p in (ROOT / "stacks").glob("*.yaml") if p.name != "images.yaml")
OWN = {"name", "extends", "description", "abstract", "kind", "known_issues"}
CITED = re.compile(r"seed 00[03]:\d+")


def listed() -> list[tuple[list[str], list[str]]]:
    """docs/engines.md's rows of values not in the seeds: (stack patterns, key patterns)."""
    text = (ROOT / "docs" / "engines.md").read_text()
    section = text.split("## Where the shipped stacks' values come from", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("stack", "---"):
            continue
        stacks = ["*"] if cells[0] == "all" else re.findall(r"`([^`]+)`", cells[0])
        rows.append((stacks, re.findall(r"`([^`]+)`", cells[2])))
    return rows


def values(node, path: tuple[str, ...] = ()):
    """(dotted key, the comment on its line) of each value the file sets."""
    for key, value in node.items():
        if not path and key in OWN:
            continue
        tokens = node.ca.items.get(key) or []
        comment = "".join(t.value for t in tokens if t is not None and not isinstance(t, list))
        if hasattr(value, "items"):
            yield from values(value, (*path, key))
        else:
            yield ".".join((*path, key)), comment.split("\n")[0]


@pytest.mark.parametrize("path", STACKS, ids=[p.stem for p in STACKS])
def test_each_value_a_stack_sets_has_a_seed_line_or_is_listed_as_not_from_the_seeds(path: Path) -> None:
    rows = listed()
    assert rows, "docs/engines.md lost its table of values not taken from the seeds"
    unsourced = [key for key, comment in values(YAML().load(path.read_text())) if not CITED.search(comment)
                 and not any(fnmatch(path.stem, s) for stacks, keys in rows if any(fnmatch(key, k) for k in keys)
                             for s in stacks)]
    assert not unsourced, f"{path.name}: neither a seed line nor listed in docs/engines.md: {unsourced}"
