"""The daemon API's vocabulary, shared by the daemon's handlers and the CLI's client: the
requests (checked once, here), the outcome that ends every action's stream (with the action's
typed result, `results.py`), and the events streamed before it. Standard library only: the CLI imports it
on every call that asks the daemon."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, replace
from typing import Any, ClassVar

from sparkctl.answers import from_fields
from sparkctl.errors import SparkctlError
from sparkctl.results import Done, decode_done, encode_done


class BadRequest(SparkctlError):
    """A request body the API cannot take (HTTP 400)."""


# --- requests -------------------------------------------------------------------------------
ACTION_ID = 64  # characters at most in a client's name for its action


@dataclass(frozen=True, kw_only=True)
class Asked:
    """What every action's request carries beside its own fields."""

    action: str = ""  # the client's name for this action, which a `CancelRequest` names (none: the daemon's)

    def __post_init__(self) -> None:
        if len(self.action) > ACTION_ID:
            raise BadRequest(f"`action` names the action in at most {ACTION_ID} characters")


@dataclass(frozen=True)
class UpRequest(Asked):
    stack: str
    refresh: bool = False
    replace: bool = False


@dataclass(frozen=True)
class PullRequest(Asked):
    stack: str
    refresh: bool = False


@dataclass(frozen=True)
class CancelRequest:
    action: str  # the action to cancel, by the name its client gave it (`Asked.action`)


@dataclass(frozen=True)
class DownRequest(Asked):
    stack: str


@dataclass(frozen=True)
class SwitchRequest(Asked):
    stack: str
    alias: str = "primary"


@dataclass(frozen=True)
class RouteRequest(Asked):
    alias: str
    rules: str = ""  # `STACK:TOKENS ... STACK` in order (policy/routing.parse); empty: the alias is not routed


@dataclass(frozen=True)
class ParkRequest(Asked):
    stack: str
    how: str = "auto"  # auto, sleep1, sleep2 or stop


@dataclass(frozen=True)
class WakeRequest(Asked):
    stack: str


@dataclass(frozen=True)
class RetestRequest(Asked):
    ref: str  # the blacklisted tag
    stack: str = ""  # the stack to measure it with (default: the one using its repository)
    force: bool = False  # measure even an unchanged or itself blacklisted digest


Request = (UpRequest | PullRequest | CancelRequest | DownRequest | SwitchRequest | ParkRequest | WakeRequest
           | RetestRequest)


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
class Prefetching:
    """The reconciler fetches a stack that is not desired, and why (the stack an alias falls back to)."""

    kind: ClassVar[str] = "prefetching"
    stack: str
    why: str


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
    action: str  # which action (`Asked.action`): several may be about one stack


Event = (PhaseChanged | Progress | Note | Died | Removed | Restarting | Failed | Realiased | Prefetching | Settled
         | Finished)
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
