"""What each action of the daemon's API ends with, as a frozen type tagged by `done` on the wire
(the stream's last line, `wire.Outcome`, carries it): `up`, `down`, `switch`, `route`, `park`,
`wake`, `retest`, `cancel` and `report`. Built by the daemon's actions; read by the CLI and the dashboard.
Standard library only, like `wire`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

from sparkctl.answers import from_fields


@dataclass(frozen=True)
class UpDone:
    done: ClassVar[str] = "up"
    stack: str
    fingerprint: str
    unchanged: bool
    url: str = ""  # the engine's, without /v1
    acceptance: float | None = None  # a DFlash stack's speculative acceptance, measured at its canary


@dataclass(frozen=True)
class PullDone:
    done: ClassVar[str] = "pull"
    stack: str
    fingerprint: str  # what an `up` will start, unless something it is made from changes first


@dataclass(frozen=True)
class DownDone:
    done: ClassVar[str] = "down"
    stack: str
    removed: int


@dataclass(frozen=True)
class SwitchDone:
    done: ClassVar[str] = "switch"
    alias: str
    stack: str
    mode: str  # blue/green, hold/swap, fleet blue/green, or unchanged (the alias named it already)
    previous: str | None = None
    why: str = ""
    timings: dict[str, float] = field(default_factory=dict)  # each step's seconds, `total_s` the whole
    park: str = ""  # how the previous stack left: sleep1, sleep2 or stop
    held_requests: int | None = None  # hold/swap: requests held, then served by the new stack
    bench: dict[str, Any] | None = None  # the switch-over benchmark's summary (or its error)
    woken: WakeDone | None = None  # the new stack was parked: how it woke
    up: UpDone | None = None  # unchanged: the `up` that made sure it runs
    hosts: tuple[str, ...] = ()  # across the fleet: where it runs now


@dataclass(frozen=True)
class RouteRule:
    stack: str
    up_to: int | None = None  # prompt tokens, inclusive; None: every longer prompt


@dataclass(frozen=True)
class RouteDone:
    done: ClassVar[str] = "route"
    alias: str
    rules: tuple[RouteRule, ...] | None = None  # None: the alias is no longer routed
    memory: float | None = None  # what the routed stacks hold of this Spark together
    ceiling: float | None = None
    fit: tuple[str, ...] = ()  # how each rule's prompts fit its stack, a line each


@dataclass(frozen=True)
class ParkDone:
    done: ClassVar[str] = "park"
    stack: str
    park: str  # sleep1, sleep2, stop, or unchanged
    why: str


@dataclass(frozen=True)
class WakeDone:
    done: ClassVar[str] = "wake"
    stack: str
    level: int  # what it slept at (0: it was stopped, and started cold)
    seconds: float  # from the /wake_up call to the warm-up's answer (or through the cold start's health)
    lowest_available: int | None = None  # MemAvailable's low point while it woke, in bytes
    killed: str | None = None  # why the watchdog killed the wake (it then started cold)


@dataclass(frozen=True)
class RetestDone:
    done: ClassVar[str] = "retest"
    ref: str  # the tag, canonical
    stack: str
    digest: str
    passed: bool
    verdict: str
    run: int | None  # the benchmark run (None: the trial never became healthy)
    deployment: int | None
    rows: tuple[dict[str, Any], ...] = ()  # the benchmark's rows, as llama-benchy reported them
    lifted: tuple[str, ...] = ()  # blacklist entries removed (a pass)
    recorded: bool = True  # False: the ban was lifted by hand while the trial ran


@dataclass(frozen=True)
class CancelDone:
    """What a cancel did: `cancelled` only when the action will not, or did not, run to its end."""

    done: ClassVar[str] = "cancel"
    action: str
    cancelled: bool
    why: str


@dataclass(frozen=True)
class ReportWritten:
    done: ClassVar[str] = "report"
    id: str  # reports/<folder>
    file: str  # its page, in that folder


Done = (UpDone | PullDone | DownDone | SwitchDone | RouteDone | ParkDone | WakeDone | RetestDone | CancelDone
        | ReportWritten)
DONE: dict[str, type[Done]] = {kind.done: kind for kind in (UpDone, PullDone, DownDone, SwitchDone, RouteDone, ParkDone,
                                                            WakeDone, RetestDone, CancelDone, ReportWritten)}


def encode_done(result: Done) -> dict[str, Any]:
    """A result as JSON, tagged with what it is the result of."""
    return {"done": result.done, **asdict(result)}


def decode_done(record: dict[str, Any]) -> Done:
    """A result back from its JSON (`encode_done`)."""
    result = from_fields(DONE[record["done"]], record)
    if isinstance(result, SwitchDone):
        return replace(result, up=result.up and from_fields(UpDone, result.up),
                       woken=result.woken and from_fields(WakeDone, result.woken), hosts=tuple(result.hosts))
    if isinstance(result, RouteDone):
        rules = None if result.rules is None else tuple(from_fields(RouteRule, r) for r in result.rules)
        return replace(result, rules=rules, fit=tuple(result.fit))
    if isinstance(result, RetestDone):
        return replace(result, rows=tuple(result.rows), lifted=tuple(result.lifted))
    return result
