"""The reconciler's pure planning: from what is desired and what is observed, the actions to
take now. No I/O, no logging, no clock of its own: the caller passes `now`.

Rules, per desired stack: a running container is left alone; a stack whose container died is
restarted (`docker start`) after an exponential backoff counted over its recent failures; a
stack with no container is deployed; `crash_loop` failures inside `window` mark it failed (no
more restarts) and move any alias it held to that alias's fallback, which becomes desired if it
was not. A fallback that is not desired is prefetched (`sparkctl pull` of it) unless what it needs
is here already, so that a failover to it waits only for its engine. A parked stack whose
container is not running is left as it is (its memory is free; waking starts it). Containers
carrying sparkctl's labels that no desired stack claims are removed, unless an action holds
their stack (a retest's trial).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace

from tenacity import wait_exponential


@dataclass(frozen=True)
class Observed:
    """One container carrying `sparkctl.stack`, as Docker reports it."""

    stack: str
    container: str
    state: str  # running, exited, dead, created, restarting, paused


@dataclass(frozen=True)
class History:
    """What the reconciler remembers of a stack between passes."""

    failures: tuple[float, ...] = ()  # times the stack's engine died or failed to deploy
    failed: str | None = None  # why it was given up on
    busy: int = 0  # actions in flight (a pass's deploy and a switch's hold can overlap)


@dataclass(frozen=True)
class Policy:
    crash_loop: int = 5
    window: float = 600.0
    backoff_base: float = 1.0
    backoff_max: float = 60.0


@dataclass(frozen=True)
class Deploy:
    stack: str


@dataclass(frozen=True)
class Restart:
    stack: str
    container: str


@dataclass(frozen=True)
class Remove:
    container: str
    reason: str


@dataclass(frozen=True)
class GiveUp:
    stack: str
    reason: str


@dataclass(frozen=True)
class Realias:
    alias: str
    stack: str
    reason: str


@dataclass(frozen=True)
class Prefetch:
    stack: str
    why: str


@dataclass(frozen=True)
class Wait:
    stack: str
    until: float


Action = Deploy | Restart | Remove | GiveUp | Realias | Prefetch | Wait


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...] = field(default_factory=tuple)

    def of(self, kind: type) -> list:
        return [a for a in self.actions if isinstance(a, kind)]


def backoff(failures: int, policy: Policy) -> float:
    """Delay before the next restart: none after the first failure, then exponential."""
    if failures <= 1:
        return 0.0
    return wait_exponential(multiplier=policy.backoff_base, max=policy.backoff_max)(
        SimpleNamespace(attempt_number=failures - 1))


def plan(stacks: tuple[str, ...], aliases: Mapping[str, str], fallbacks: Mapping[str, str],
         observed: list[Observed], history: Mapping[str, History], *, now: float, policy: Policy,
         parked: Mapping[str, int] | None = None, fetched: Callable[[str], bool] = lambda _: False) -> Plan:
    """`fetched(stack)`: whether what the stack needs (image, weights, patches) is here for it as
    it is now."""
    actions: list[Action] = []
    desired = set(stacks)
    for o in observed:  # an action in flight on a stack (a retest's trial) holds its container
        if o.stack not in desired and not history.get(o.stack, History()).busy:
            actions.append(Remove(o.container, f"no desired stack claims {o.stack}"))
    for stack in (s for s in stacks if s not in (parked or {}) or _running(observed, s)):
        actions += _for_stack(stack, [o for o in observed if o.stack == stack], history.get(stack, History()),
                              now=now, policy=policy)
    given_up = {a.stack: a.reason for a in actions if isinstance(a, GiveUp)}
    given_up |= {s: h.failed for s, h in history.items() if h.failed and s in desired}
    for alias, stack in aliases.items():
        fallback = fallbacks.get(alias)
        if stack in given_up and fallback and fallback != stack and fallback not in given_up:
            actions.append(Realias(alias, fallback, f"{stack} failed: {given_up[stack]}"))
    standby: dict[str, list[str]] = {}  # a fallback not desired -> the aliases it stands by for
    for alias, stack in sorted(fallbacks.items()):
        if stack not in desired:
            standby.setdefault(stack, []).append(alias)
    for stack, by in standby.items():
        h = history.get(stack, History())
        if not (h.busy or h.failures or fetched(stack)):  # a failed prefetch waits for an `up` or a restart
            actions.append(Prefetch(stack, f"the fallback of alias {', '.join(by)}: a failover to it then waits "
                                           "only for its engine"))
    return Plan(tuple(actions))


def _running(observed: list[Observed], stack: str) -> bool:
    return any(o.stack == stack and o.state in ("running", "restarting") for o in observed)


def _for_stack(stack: str, mine: list[Observed], h: History, *, now: float, policy: Policy) -> list[Action]:
    if h.busy or h.failed:
        return []
    running = [o for o in mine if o.state in ("running", "restarting")]
    if running:  # keep one; anything else of this stack is a duplicate or a leftover
        return [Remove(o.container, f"duplicate container of {stack}") for o in running[1:]] + \
               [Remove(o.container, f"leftover container of {stack}") for o in mine if o not in running]
    recent = [t for t in h.failures if now - t <= policy.window]
    if len(recent) >= policy.crash_loop:
        return [GiveUp(stack, f"crash loop: {len(recent)} failures in {policy.window:g} s")]
    ready_at = (max(recent) + backoff(len(recent), policy)) if recent else now
    if now < ready_at:
        return [Wait(stack, ready_at)]
    dead = [o for o in mine if o.state in ("exited", "dead", "created")]
    if dead:
        return [Restart(stack, dead[0].container)] + [Remove(o.container, "older dead container") for o in dead[1:]]
    return [Deploy(stack)]
