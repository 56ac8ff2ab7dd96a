"""Desired state (`desired.yaml` in the state dir): which stacks should run, the aliases
(`primary: STACK`, `batch: STACK`) with optional fallbacks for when a stack fails for good, and
which running stacks are parked (asleep, at vLLM sleep level 1 or 2; 0: stopped, kept).

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
    parked: dict[str, int] = field(default_factory=dict)  # stack -> sleep level (0: stopped)

    def park(self, name: str, level: int) -> Desired:
        return replace(self, parked={**self.parked, name: level})

    def awake(self, name: str) -> Desired:
        return replace(self, parked={s: level for s, level in self.parked.items() if s != name})

    def with_stack(self, name: str) -> Desired:
        return self if name in self.stacks else replace(self, stacks=(*self.stacks, name))

    def without_stack(self, name: str) -> Desired:
        return replace(self.awake(name), stacks=tuple(s for s in self.stacks if s != name))


def load(path: Path) -> Desired:
    """The desired state; a file that is not what `save` writes names the file, line and key."""
    if not path.exists():
        return Desired()
    data = yamlfile.read(path) or {}
    if not isinstance(data, dict) or set(data) - {"stacks", "aliases", "fallbacks", "parked"}:
        raise SpecError(str(path), "", "expected a mapping with `stacks`, `aliases`, `fallbacks`, `parked`")
    stacks = data.get("stacks") or []
    if not isinstance(stacks, list) or not all(isinstance(s, str) for s in stacks):
        raise SpecError(str(path), "stacks", f"expected a list of stack names, got {stacks!r:.60}")
    for key in ("aliases", "fallbacks"):
        table = data.get(key) or {}
        if not isinstance(table, dict) or not all(isinstance(v, str) for v in [*table, *table.values()]):
            raise SpecError(str(path), key, f"expected a mapping of alias to stack name, got {table!r:.60}")
    parked = data.get("parked") or {}
    if not isinstance(parked, dict) or not all(isinstance(s, str) and type(level) is int and level in (0, 1, 2)
                                               for s, level in parked.items()):
        raise SpecError(str(path), "parked", f"expected a mapping of stack name to 0, 1 or 2, got {parked!r:.60}")
    return Desired(tuple(stacks), dict(data.get("aliases") or {}), dict(data.get("fallbacks") or {}), dict(parked))


def save(path: Path, desired: Desired) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        YAML().dump({"stacks": list(desired.stacks), "aliases": dict(desired.aliases),
                     "fallbacks": dict(desired.fallbacks), "parked": dict(desired.parked)}, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
