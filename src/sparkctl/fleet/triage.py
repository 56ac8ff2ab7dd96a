"""What the head's daemon does about a placed replica whose `/health` failed: pure, from one
observation. The fleet watch's probes (`fleet/watch.py`) observe once per probe pass (for each
failing replica: Ray's node table before and after its host's agent was asked, that agent's
`containers()` answer, the book as it is after the answer), decide here, then act and log.

A replica is started again on its host only when that host's agent answered in this observation
and reported the stack's container gone or exited, while Ray listed the same live node for the
host before and after the asking (issue 31). An agent that did not answer gets nothing, whatever
Ray still says: its host may be dying, and a restart sent there could run once the host is back,
beside the replica the node watch re-placed elsewhere. Ray's verdict settles it: a dead node's
stacks are the node watch's to re-place; a live node's agent is asked again at the next pass. A
container that still runs while its `/health` fails is left alone (it starts, or it hangs): the
gateway routes around it. Restarts obey the crash-loop rule, counted per stack and host.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sparkctl.node import AgentAnswer, Node

RUNNING = ("running", "restarting", "paused")  # Docker's states of a container that is not gone


class Why(StrEnum):
    """Why nothing is done about a failing replica in this pass."""

    HOST_DOWN = "host_down"  # Ray does not list its host alive, or the node watch holds it out
    MOVED = "moved"  # the book no longer places it as the pass read it (re-placed, parked, taken down)
    UNREACHABLE = "agent_unreachable"  # its host's agent gave no answer: Ray's verdict decides
    NODE_CHANGED = "node_changed"  # Ray's node for the host changed while its agent was asked
    RUNNING = "container_running"  # its container runs: starting, or hung; routed around
    GIVEN_UP = "crash_loop"  # left alone until it answers again

    def awaits_ray(self) -> bool:
        """Whether Ray's verdict on the host, not the replica, decides what happens next."""
        return self in (Why.UNREACHABLE, Why.NODE_CHANGED)


@dataclass(frozen=True)
class Seen:
    """One failing replica as a pass observed it."""

    stack: str
    host: str
    url: str
    placed: bool  # the book, read after the agents answered, still places the stack as the pass found it
    down: bool  # the node watch holds the host out of routing (dead, or back but not yet swept)
    node_before: str | None  # the host's live node in Ray's table before its agent was asked; None: none
    node_after: str | None  # the same, once the agent answered (or not)
    answer: AgentAnswer | None  # the agent's `containers()`; None when it was not asked

    @property
    def key(self) -> str:
        """What the crash-loop rule counts by."""
        return f"{self.stack}@{self.host}"


@dataclass(frozen=True)
class Restart:
    seen: Seen
    state: str  # what the agent reported: Docker's state of the stack's container, or "gone"
    failures: tuple[float, ...]  # the key's failures in the window, this one included


@dataclass(frozen=True)
class GiveUp:
    seen: Seen
    failures: tuple[float, ...]


@dataclass(frozen=True)
class Leave:
    seen: Seen
    why: Why


Decision = Restart | GiveUp | Leave


def decide(seen: Seen, *, failures: tuple[float, ...], given_up: bool, now: float, crash_loop: int,
           window: float) -> Decision:
    """What to do about `seen`, a replica that failed its `/health`: restart it only on its
    host's word that its container is gone or exited; `failures` are the key's earlier ones."""
    if seen.down or seen.node_before is None or seen.node_after is None:
        return Leave(seen, Why.HOST_DOWN)
    if not seen.placed:
        return Leave(seen, Why.MOVED)
    if seen.answer is None or not seen.answer.ok:
        return Leave(seen, Why.UNREACHABLE)
    if seen.node_before != seen.node_after:
        return Leave(seen, Why.NODE_CHANGED)
    state = container_state(seen.answer, seen.stack)
    if state in RUNNING:
        return Leave(seen, Why.RUNNING)
    if given_up:
        return Leave(seen, Why.GIVEN_UP)
    recent, looping = count_failure(failures, now=now, crash_loop=crash_loop, window=window)
    return GiveUp(seen, recent) if looping else Restart(seen, state, recent)


def count_failure(failures: tuple[float, ...], *, now: float, crash_loop: int, window: float
                  ) -> tuple[tuple[float, ...], bool]:
    """One more failure at `now`: the failures still in the window, and whether they make a
    crash loop (from then on the replica or group is left alone until it answers again)."""
    recent = tuple(t for t in failures if now - t < window) + (now,)
    return recent, len(recent) >= crash_loop


def container_state(answer: AgentAnswer, stack: str) -> str:
    """Docker's state of `stack`'s container in a host's `containers()` answer (a running one
    first), or "gone" when the host lists none."""
    states = [c.state for c in answer.value if c.stack == stack]
    return next((s for s in states if s in RUNNING), states[0] if states else "gone")


def live_node(nodes: list[Node] | None, host: str) -> str | None:
    """The id of `host`'s live node in Ray's table, or None (no table yet, or none alive)."""
    return next((n.node_id for n in nodes or [] if n.host == host and n.state.is_up()), None)
