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
from sparkctl.spec import yamlfile


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
    """The desired state; a file that is not what `save` writes names the file, line and key."""
    if not path.exists():
        return Desired()
    data = yamlfile.read(path) or {}
    if not isinstance(data, dict) or set(data) - {"stacks", "aliases", "fallbacks"}:
        raise SpecError(str(path), "", "expected a mapping with `stacks`, `aliases`, `fallbacks`")
    stacks = data.get("stacks") or []
    if not isinstance(stacks, list) or not all(isinstance(s, str) for s in stacks):
        raise SpecError(str(path), "stacks", f"expected a list of stack names, got {stacks!r:.60}")
    for key in ("aliases", "fallbacks"):
        table = data.get(key) or {}
        if not isinstance(table, dict) or not all(isinstance(v, str) for v in [*table, *table.values()]):
            raise SpecError(str(path), key, f"expected a mapping of alias to stack name, got {table!r:.60}")
    return Desired(tuple(stacks), dict(data.get("aliases") or {}), dict(data.get("fallbacks") or {}))


def save(path: Path, desired: Desired) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        YAML().dump({"stacks": list(desired.stacks), "aliases": dict(desired.aliases),
                     "fallbacks": dict(desired.fallbacks)}, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
