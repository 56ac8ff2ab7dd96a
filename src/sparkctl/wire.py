"""The daemon API's vocabulary, shared by the daemon's handlers and the CLI's client: the
requests (checked once, here), each action's typed result (tagged by `done` on the wire), the
outcome that ends every action's stream, and the events streamed before it. Standard library only: the CLI imports it
on every call that asks the daemon."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any, ClassVar

from sparkctl.answers import from_fields
from sparkctl.errors import SparkctlError


class BadRequest(SparkctlError):
    """A request body the API cannot take (HTTP 400)."""


# --- requests -------------------------------------------------------------------------------
@dataclass(frozen=True)
class UpRequest:
    stack: str
    refresh: bool = False
    replace: bool = False


@dataclass(frozen=True)
class DownRequest:
    stack: str


@dataclass(frozen=True)
class SwitchRequest:
    stack: str
    alias: str = "primary"


@dataclass(frozen=True)
class RouteRequest:
    alias: str
    rules: str = ""  # `STACK:TOKENS ... STACK` in order (policy/routing.parse); empty: the alias is not routed


@dataclass(frozen=True)
class ParkRequest:
    stack: str
    how: str = "auto"  # auto, sleep1, sleep2 or stop


@dataclass(frozen=True)
class WakeRequest:
    stack: str


@dataclass(frozen=True)
class RetestRequest:
    ref: str  # the blacklisted tag
    stack: str = ""  # the stack to measure it with (default: the one using its repository)
    force: bool = False  # measure even an unchanged or itself blacklisted digest


Request = UpRequest | DownRequest | SwitchRequest | ParkRequest | WakeRequest | RetestRequest


def parse(kind: type[Request], body: object) -> Request:
    """The request in `body` (decoded JSON), or BadRequest naming what is wrong. Fields without a
    default are required strings; a flag is taken as true or false; an optional string left out
    (or empty) takes its default."""
    required = [f.name for f in fields(kind) if f.default is MISSING]
    if not isinstance(body, dict) or any(not isinstance(body.get(name), str) for name in required):
        raise BadRequest(f"request body must be a JSON object with string fields: {', '.join(required)}")
    values = {}
    for f in fields(kind):
        value = body.get(f.name)
        if isinstance(f.default, bool):
            value = bool(value)
        elif f.default is not MISSING and not value:
            value = f.default
        elif not isinstance(value, str):
            raise BadRequest(f"`{f.name}` must be a string")
        values[f.name] = value
    return kind(**values)


# --- results --------------------------------------------------------------------------------
@dataclass(frozen=True)
class UpDone:
    done: ClassVar[str] = "up"
    stack: str
    fingerprint: str
    unchanged: bool


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
class ReportWritten:
    done: ClassVar[str] = "report"
    id: str  # reports/<folder>
    file: str  # its page, in that folder


Done = UpDone | DownDone | SwitchDone | RouteDone | ParkDone | WakeDone | RetestDone | ReportWritten
DONE: dict[str, type[Done]] = {kind.done: kind for kind in (UpDone, DownDone, SwitchDone, RouteDone, ParkDone,
                                                            WakeDone, RetestDone, ReportWritten)}


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


@dataclass(frozen=True)
class Outcome:
    """The last line of an action's stream: its result, or the error that stopped it."""

    kind: ClassVar[str] = "outcome"
    stack: str
    ok: bool
    result: Done | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        line: dict[str, Any] = {"kind": self.kind, "stack": self.stack, "ok": self.ok}
        if self.result is not None:
            line["result"] = encode_done(self.result)
        if self.error is not None:
            line["error"] = self.error
        return line


# --- events ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class PhaseChanged:
    kind: ClassVar[str] = "phase"
    stack: str
    phase: str
    detail: str = ""


@dataclass(frozen=True)
class Progress:
    kind: ClassVar[str] = "progress"
    stack: str
    task: str
    done: int
    total: int


@dataclass(frozen=True)
class Note:
    kind: ClassVar[str] = "note"
    stack: str
    text: str


@dataclass(frozen=True)
class Died:
    kind: ClassVar[str] = "died"
    stack: str
    cause: str
    oom: bool


@dataclass(frozen=True)
class Removed:
    kind: ClassVar[str] = "removed"
    container: str
    reason: str


@dataclass(frozen=True)
class Restarting:
    kind: ClassVar[str] = "restarting"
    stack: str


@dataclass(frozen=True)
class Failed:
    kind: ClassVar[str] = "failed"
    stack: str
    reason: str


@dataclass(frozen=True)
class Realiased:
    kind: ClassVar[str] = "realiased"
    alias: str
    stack: str
    reason: str


@dataclass(frozen=True)
class Settled:
    """A reconciler action on a stack ended (`error` None: it succeeded)."""

    kind: ClassVar[str] = "outcome"
    stack: str
    ok: bool
    error: str | None


@dataclass(frozen=True)
class Finished:
    """An API action ended: its stream has seen all of its events and ends at once."""

    kind: ClassVar[str] = "finished"
    stack: str
    action: int  # which action: several may be about one stack


Event = PhaseChanged | Progress | Note | Died | Removed | Restarting | Failed | Realiased | Settled | Finished
STREAMED = ("phase", "progress", "note")  # what an action's stream passes on to its client


def decode(record: dict[str, Any]) -> Event | Outcome | None:
    """A streamed line back into its record (None for a kind this client does not know)."""
    kind = {"phase": PhaseChanged, "progress": Progress, "note": Note, "outcome": Outcome}.get(record.get("kind"))
    if kind is None:
        return None
    decoded = from_fields(kind, record)
    if isinstance(decoded, Outcome) and decoded.result is not None:
        return replace(decoded, result=decode_done(record["result"]))
    return decoded
