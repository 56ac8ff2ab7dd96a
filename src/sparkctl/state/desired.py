"""Desired state (`desired.yaml` in the state dir): which stacks should run, the aliases
(`primary: STACK`, `batch: STACK`) with optional fallbacks for when a stack fails for good, the
routed aliases (`routes: {primary: [{stack: A, up_to: 8192}, {stack: B}]}`: a request goes to the
first stack whose `up_to` holds its prompt's tokens), and which running stacks are parked
(asleep, at vLLM sleep level 1 or 2; 0: stopped, kept).

The daemon owns the file: CLI verbs change it through the daemon's API. Writes are atomic
(temp file + rename), so a daemon killed mid-write leaves the old or the new file, never half.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ruamel.yaml import YAML

from sparkctl.errors import SparkctlError, SpecError
from sparkctl.policy import routing
from sparkctl.policy.routing import Rule
from sparkctl.spec import yamlfile

KEYS = ("stacks", "aliases", "fallbacks", "routes", "parked")


@dataclass(frozen=True)
class Desired:
    stacks: tuple[str, ...] = ()
    aliases: dict[str, str] = field(default_factory=dict)
    fallbacks: dict[str, str] = field(default_factory=dict)  # alias -> stack to use if its stack fails
    parked: dict[str, int] = field(default_factory=dict)  # stack -> sleep level (0: stopped)
    routes: dict[str, tuple[Rule, ...]] = field(default_factory=dict)  # routed alias -> its rules, in order

    def park(self, name: str, level: int) -> Desired:
        return replace(self, parked={**self.parked, name: level})

    def awake(self, name: str) -> Desired:
        return replace(self, parked={s: level for s, level in self.parked.items() if s != name})

    def routed(self, alias: str, rules: tuple[Rule, ...] | None) -> Desired:
        """`alias` routed by `rules` (it stops being a plain alias), or, with None, not routed."""
        routes = {a: r for a, r in self.routes.items() if a != alias} | ({alias: rules} if rules else {})
        aliases = {a: s for a, s in self.aliases.items() if a != alias or rules is None}
        return replace(self, routes=routes, aliases=aliases)

    def with_stack(self, name: str) -> Desired:
        return self if name in self.stacks else replace(self, stacks=(*self.stacks, name))

    def without_stack(self, name: str) -> Desired:
        return replace(self.awake(name), stacks=tuple(s for s in self.stacks if s != name))


def load(path: Path) -> Desired:
    """The desired state; a file that is not what `save` writes names the file, line and key."""
    if not path.exists():
        return Desired()
    data = yamlfile.read(path) or {}
    if not isinstance(data, dict) or set(data) - set(KEYS):
        raise SpecError(str(path), "", "expected a mapping with " + ", ".join(f"`{k}`" for k in KEYS))
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
    routes = {alias: _rules(path, alias, rules) for alias, rules in _mapping(path, data.get("routes")).items()}
    if both := sorted(set(routes) & set(data.get("aliases") or {})):
        raise SpecError(str(path), f"routes.{both[0]}", "an alias is either plain (`aliases`) or routed, not both")
    return Desired(tuple(stacks), dict(data.get("aliases") or {}), dict(data.get("fallbacks") or {}), dict(parked),
                   routes)


def _mapping(path: Path, value: object) -> dict:
    if not isinstance(value, dict | None) or not all(isinstance(k, str) for k in value or {}):
        raise SpecError(str(path), "routes", f"expected a mapping of alias to its rules, got {value!r:.60}")
    return value or {}


def _rules(path: Path, alias: str, rules: object) -> tuple[Rule, ...]:
    key = f"routes.{alias}"
    if not isinstance(rules, list) or not all(isinstance(r, dict) and isinstance(r.get("stack"), str)
                                              and set(r) <= {"stack", "up_to"} for r in rules):
        raise SpecError(str(path), key, f"expected a list of {{stack: NAME, up_to: TOKENS}}, got {rules!r:.60}")
    if not all(type(r.get("up_to", 0)) is int or r.get("up_to") is None for r in rules):
        raise SpecError(str(path), key, "`up_to` is a whole number of prompt tokens")
    try:
        return routing.check(alias, [Rule(r["stack"], r.get("up_to")) for r in rules])
    except SparkctlError as e:
        raise SpecError(str(path), key, str(e)) from None


def save(path: Path, desired: Desired) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        YAML().dump({"stacks": list(desired.stacks), "aliases": dict(desired.aliases),
                     "fallbacks": dict(desired.fallbacks), "parked": dict(desired.parked),
                     "routes": {alias: [{"stack": r.stack} | ({"up_to": r.up_to} if r.up_to is not None else {})
                                        for r in rules] for alias, rules in desired.routes.items()}}, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


class DesiredFile:
    """The daemon's one owner of `desired.yaml`: every read and change goes through it, one at a time."""

    def __init__(self, path: Path) -> None:
        self.path, self._lock = path, threading.Lock()

    def read(self) -> Desired:
        with self._lock:
            return load(self.path)

    def update(self, change: Callable[[Desired], Desired]) -> Desired:
        with self._lock:
            old = load(self.path)
            new = change(old)
            if new != old:  # e.g. `up` of a stack already desired: no write, no fsync
                save(self.path, new)
            return new
