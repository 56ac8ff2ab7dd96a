"""Desired state (`desired.yaml` in the state dir): which stacks should run, and the aliases
(`primary: STACK`, `batch: STACK`) with optional fallbacks for when a stack fails for good.

The daemon owns the file: CLI verbs change it through the daemon's API. Writes are atomic
(temp file + rename), so a daemon killed mid-write leaves the old or the new file, never half.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from ruamel.yaml import YAML

from sparkctl.errors import SpecError


@dataclass(frozen=True)
class Desired:
    stacks: tuple[str, ...] = ()
    aliases: dict[str, str] = field(default_factory=dict)
    fallbacks: dict[str, str] = field(default_factory=dict)  # alias -> stack to use if its stack fails

    def with_stack(self, name: str) -> Desired:
        return self if name in self.stacks else replace(self, stacks=(*self.stacks, name))

    def without_stack(self, name: str) -> Desired:
        return replace(self, stacks=tuple(s for s in self.stacks if s != name))


def load(path: Path) -> Desired:
    if not path.exists():
        return Desired()
    data = YAML(typ="safe").load(path.read_text()) or {}
    if not isinstance(data, dict) or set(data) - {"stacks", "aliases", "fallbacks"}:
        raise SpecError(str(path), "", "expected a mapping with `stacks`, `aliases`, `fallbacks`")
    return Desired(tuple(data.get("stacks") or ()), dict(data.get("aliases") or {}),
                   dict(data.get("fallbacks") or {}))


def save(path: Path, desired: Desired) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as out:
        YAML().dump({"stacks": list(desired.stacks), "aliases": dict(desired.aliases),
                     "fallbacks": dict(desired.fallbacks)}, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
