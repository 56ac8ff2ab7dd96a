"""The gateway's routing table: model names (aliases and served names) to upstream stacks, each
served by one engine or by several replicas (`Upstream.urls`, on any host of the fleet; which one
gets a request is `replicas.py`'s choice).

Built from the desired state and the stack files by whoever owns them (the daemon); replaced
atomically as a whole, so a request sees either the old table or the new one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sparkctl.policy.routing import Rule


@dataclass(frozen=True)
class Upstream:
    stack: str
    url: str  # http://127.0.0.1:PORT
    served_name: str
    max_concurrency: int | None = None  # the stack's enforced known-issue cap; excess requests queue
    # Parameters added to each request unless the client set them (`defaults.py`); read-only.
    request_defaults: Mapping[str, object] = field(default_factory=dict, hash=False)
    # More engines serving the same stack (replicas, e.g. http://10.213.7.3:8110 on another host).
    replicas: tuple[str, ...] = ()
    placed: bool = False  # placed across a fleet: held, not failed, while no replica answers
    # The `Authorization` its engines ask for: a placed stack's hosts relay them (`relay.py`).
    auth: str | None = field(default=None, repr=False)

    @property
    def headers(self) -> list[tuple[str, str]]:
        """What each request to one of its engines carries beyond its body's type."""
        return [("Authorization", self.auth)] if self.auth else []

    @property
    def urls(self) -> tuple[str, ...]:
        """Every engine of the stack: `url` first, then the other replicas."""
        return (self.url, *self.replicas)


@dataclass(frozen=True)
class RouteTable:
    upstreams: dict[str, Upstream] = field(default_factory=dict)  # stack -> upstream
    aliases: dict[str, str] = field(default_factory=dict)  # alias -> stack
    parked: dict[str, str] = field(default_factory=dict)  # a parked stack's names and aliases -> the stack
    rules: dict[str, tuple[Rule, ...]] = field(default_factory=dict)  # routed alias -> its rules

    def resolve(self, model: str) -> Upstream | None:
        """An alias, a served name or a stack name, to its upstream."""
        stack = self.aliases.get(model)
        if stack is not None:
            return self.upstreams.get(stack)
        return next((u for u in self.upstreams.values() if model in (u.served_name, u.stack)), None)

    def models(self) -> list[dict[str, object]]:
        """`/v1/models` entries: every alias, then every served name; a parked stack's are marked
        `parked` (a request to one wakes it)."""
        cards: list[dict[str, object]] = [
            {"id": alias, "object": "model", "owned_by": "sparkctl", "root": self.upstreams[stack].served_name}
            for alias, stack in sorted(self.aliases.items()) if stack in self.upstreams]
        cards += [{"id": u.served_name, "object": "model", "owned_by": "sparkctl", "root": u.served_name}
                  for u in sorted(self.upstreams.values(), key=lambda u: u.served_name)]
        cards += [{"id": name, "object": "model", "owned_by": "sparkctl", "root": stack, "parked": True}
                  for name, stack in sorted(self.parked.items())]
        cards += [{"id": alias, "object": "model", "owned_by": "sparkctl", "root": rules[-1].stack,
                   "routes": [{"stack": r.stack, "up_to": r.up_to} for r in rules]}
                  for alias, rules in sorted(self.rules.items())]
        return cards


def build_table(*, aliases: dict[str, str], stacks: Mapping[str, Upstream], running: set[str],
                parked: set[str] = frozenset(), routes: Mapping[str, tuple[Rule, ...]] | None = None) -> RouteTable:
    """Routes to the running stacks: `stacks` maps each deployable stack's name to its upstream.
    A parked stack's names lead to it too, for the gateway to wake it on demand. A routed alias
    is kept while every stack it names is deployable (one not running gets a clear 404)."""
    upstreams = {name: upstream for name, upstream in stacks.items() if name in running}
    asleep = {name: stack for stack in parked if stack in stacks for name in (stack, stacks[stack].served_name)}
    asleep |= {alias: stack for alias, stack in aliases.items() if stack in parked and stack in stacks}
    rules = {alias: rules for alias, rules in (routes or {}).items() if all(r.stack in stacks for r in rules)}
    return RouteTable(upstreams, {alias: stack for alias, stack in aliases.items() if stack in upstreams}, asleep,
                      rules)
