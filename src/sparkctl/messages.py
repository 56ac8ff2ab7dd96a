"""The daemon API's messages, shared by the daemon's handlers, the CLI's client and the dashboard:
the requests (checked once, here), what each action ends with (a frozen type tagged by `done`,
carried by the `Outcome` that ends every action's stream), the events streamed before it, and
what the queries answer (status rows, stacks, series, runs, reports, history). Sent as JSON
(`dataclasses.asdict`) and read back by one decoder, `load`, which follows the types' own field
annotations. Standard library only: the CLI imports it on every call that asks the daemon."""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from typing import Any, ClassVar

from sparkctl.errors import SparkctlError
from sparkctl.node import HostContainer


def load(kind: Any, value: Any) -> Any:
    """`value` (decoded JSON) as the type `kind`: a message's keys that are its fields (a later
    version's extra keys are left), each read as its annotation says; a result as the type its
    `done` tag names."""
    if value is None:
        return None
    origin = typing.get_origin(kind)
    if origin in (types.UnionType, typing.Union):
        members = [k for k in typing.get_args(kind) if k is not type(None)]
        if len(members) > 1 and isinstance(value, dict) and "done" in value:
            return load(DONE[value["done"]], value)
        return load(members[0], value)
    if origin is tuple:
        args = typing.get_args(kind)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(load(args[0], item) for item in value)
        return tuple(load(k, item) for k, item in zip(args, value, strict=False))
    if origin is dict:
        _, item = typing.get_args(kind)
        return {key: load(item, v) for key, v in value.items()}
    if is_dataclass(kind):
        hints = _hints(kind)
        return kind(**{f.name: load(hints[f.name], value[f.name]) for f in fields(kind) if f.name in value})
    return value


@functools.cache
def _hints(kind: type) -> dict[str, Any]:
    return typing.get_type_hints(kind)


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


@dataclass(frozen=True)
class BenchRequest(Asked):
    stack: str
    profile: str = ""  # quick, seed, concurrency or quality (default: the stack's bench_profile)
    depths: str = ""  # the profile's depths replaced: `0,4096,8192`
    runs: int | None = None  # the profile's runs per depth replaced
    temperature: float | None = None  # sample at this temperature (default: the engine's)
    skip_coherence: bool = False


@dataclass(frozen=True)
class PatchCheckRequest(Asked):
    stack: str


IMAGE_EDITS = ("pin", "unpin", "blacklist", "unblacklist", "forget-wake")


@dataclass(frozen=True)
class ImageEdit:
    """An edit of the image policy (`images.yaml`), which the daemon owns."""

    edit: str  # one of IMAGE_EDITS
    ref: str  # repo:tag, repo@sha256:..., or a bare digest (forget-wake: the digest)
    digest: str = ""  # pin: the digest (default: the registry's); blacklist: what the tag names now
    provenance: str = ""  # pin: why this digest is trusted
    reason: str = ""  # blacklist: what is broken

    def __post_init__(self) -> None:
        if self.edit not in IMAGE_EDITS:
            raise BadRequest(f"`edit` must be one of {', '.join(IMAGE_EDITS)}")


@dataclass(frozen=True)
class FleetUpRequest(Asked):
    stack: str
    wait: float = 0.0  # s each host has to pull, fetch and start its engine (0: SPARKCTL_FLEET_DEPLOY_TIMEOUT)


@dataclass(frozen=True)
class FleetDownRequest(Asked):
    stack: str
    wait: float = 40.0  # s each host has to confirm its containers are gone


@dataclass(frozen=True)
class FleetPsRequest:
    wait: float = 10.0  # s each host's agent has to answer before the host is named unreachable
    book_only: bool = False  # the book's placements, without asking any host


Request = (UpRequest | PullRequest | CancelRequest | DownRequest | SwitchRequest | ParkRequest | WakeRequest
           | RetestRequest | BenchRequest | PatchCheckRequest | ImageEdit | FleetUpRequest | FleetDownRequest
           | FleetPsRequest)


def parse(kind: type[Request], body: object) -> Request:
    """The request in `body` (decoded JSON), or BadRequest naming what is wrong. Fields without a
    default are required strings; a flag is taken as true or false, a number as a number; an
    optional string left out (or empty) takes its default."""
    required = [f.name for f in fields(kind) if f.default is MISSING]
    if not isinstance(body, dict) or any(not isinstance(body.get(name), str) for name in required):
        raise BadRequest(f"request body must be a JSON object with string fields: {', '.join(required)}")
    values = {}
    for f in fields(kind):
        value = body.get(f.name)
        if isinstance(f.default, bool):
            value = bool(value)
        elif f.default is None or isinstance(f.default, float):  # a number (None: its default's own)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
                raise BadRequest(f"`{f.name}` must be a number, at least 0, not {value!r}")
            value = f.default if value is None else value
        elif f.default is not MISSING and not value:
            value = f.default
        elif not isinstance(value, str):
            raise BadRequest(f"`{f.name}` must be a string")
        values[f.name] = value
    return kind(**values)


# --- what each action ends with --------------------------------------------------------------
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
    quality_run: int | None = None  # with `expectations.quality`: the trial's quality run
    quality: str = ""  # and what it measured: "<task> <accuracy> (95% CI ..) over N items (tool)"


@dataclass(frozen=True)
class BenchDone:
    done: ClassVar[str] = "bench"
    stack: str
    run: int
    profile: str
    folder: str  # the run's raw files
    passed: bool
    verdict: str  # the gate's, described
    rows: tuple[dict[str, Any], ...] = ()  # per depth and concurrency, as llama-benchy reported them
    quality: str = ""  # profile `quality`: the run (a quality run) in one phrase: task, accuracy, items, tool


@dataclass(frozen=True)
class PatchChecked:
    done: ClassVar[str] = "patch-check"
    stack: str
    files: int = 0  # the files patched (0: the stack has no patch sets)
    hash: str = ""  # of the patched files
    vllm_dir: str = ""  # vLLM's package dir in the image
    diff: str = ""  # unified, image against patched


@dataclass(frozen=True)
class ImageEdited:
    done: ClassVar[str] = "image"
    edit: str
    ref: str  # as the policy keys it
    digest: str = ""  # pin: the digest pinned


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


@dataclass(frozen=True)
class FleetReplica:
    host: str
    url: str
    fingerprint: str


@dataclass(frozen=True)
class FleetUpDone:
    done: ClassVar[str] = "fleet up"
    stack: str
    replicas: tuple[FleetReplica, ...]
    failed: dict[str, str] = field(default_factory=dict)  # host -> why its engine did not start
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class FleetDownDone:
    done: ClassVar[str] = "fleet down"
    stack: str
    removed: dict[str, tuple[str, ...]]  # host -> names its Docker removed (confirmed gone)
    unreachable: dict[str, str] = field(default_factory=dict)  # host -> why it could not confirm anything


@dataclass(frozen=True)
class FleetPs:
    """Every host's containers of this instance, as each host's agent listed them, and the book."""

    hosts: tuple[str, ...]  # every host asked, in order
    containers: tuple[HostContainer, ...] = ()  # as each host's agent listed them
    unreachable: dict[str, str] = field(default_factory=dict)  # host -> why it gave no answer
    placed: dict[str, tuple[str, ...]] = field(default_factory=dict)  # the book: stack -> its hosts (ranks in order)
    parked: tuple[str, ...] = ()  # the book's stacks parked across the fleet (no engine; placement kept)


Done = (UpDone | PullDone | DownDone | SwitchDone | RouteDone | ParkDone | WakeDone | RetestDone | BenchDone
        | PatchChecked | ImageEdited | CancelDone | ReportWritten | FleetUpDone | FleetDownDone)
DONE: dict[str, type[Done]] = {kind.done: kind for kind in typing.get_args(Done)}


def encode_done(result: Done) -> dict[str, Any]:
    """A result as JSON, tagged with what it is the result of (`load(Done, ...)` reads it back)."""
    return {"done": result.done, **asdict(result)}


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
    return None if kind is None else load(kind, record)


# --- what the queries answer -----------------------------------------------------------------
@dataclass(frozen=True)
class DesiredState:
    """What the daemon is asked to keep (`desired.yaml`, which it owns)."""

    stacks: tuple[str, ...] = ()
    aliases: dict[str, str] = field(default_factory=dict)
    fallbacks: dict[str, str] = field(default_factory=dict)
    parked: dict[str, int] = field(default_factory=dict)  # stack -> sleep level (0: stopped)
    routes: dict[str, tuple[RouteRule, ...]] = field(default_factory=dict)  # routed alias -> its rules, in order


@dataclass(frozen=True)
class KvRow:
    """An engine's KV headroom as its build recorded it: the figures, the fit, what falls short."""

    kv_tokens: int
    max_model_len: int | None
    max_num_seqs: int | None
    min_kv_tokens: int | None
    full_context: float | None  # requests at max_model_len the KV cache holds at once
    summary: str
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class StatusRow:
    """A stack of the instance: its container (or `absent`), its last deployment, and what the
    daemon knows beside (desired, failures, parked level, restarts, image verdict)."""

    stack: str
    phase: str
    state: str  # the container's (running, exited, created...), or absent
    endpoint: str
    fingerprint: str | None
    container: str
    uptime_s: int | None
    memory: float | None  # its share of unified memory
    error: str | None
    kv: KvRow | None
    desired: bool = False
    failed: bool = False
    recent_failures: int = 0
    parked: int | None = None  # its sleep level (0: stopped), None when it is not parked
    restarts: int = 0
    acceptance: float | None = None  # speculative decoding's, since the engine started
    image: str | None = None
    digest: str | None = None
    verdict: str | None = None  # the image policy's: known-good, pinned, unpinned or blacklisted: why
    quality: str | None = None  # its last quality run: "<task> <accuracy> (95% CI ..) over N items (tool): <verdict>"


@dataclass(frozen=True)
class MemoryHeld:
    held: dict[str, float]  # each stack's share of unified memory
    ceiling: float
    parked: dict[str, int]  # each parked stack's sleep level


@dataclass(frozen=True)
class Status:
    stacks: tuple[StatusRow, ...]
    others: dict[str, list[str]]  # other sparkctl instances on this Docker engine, and their stacks
    aliases: dict[str, str] = field(default_factory=dict)
    pid: int | None = None  # the daemon's
    instance: str = ""
    memory: MemoryHeld | None = None
    catalog: tuple[str, ...] = ()  # the stacks that can be deployed


@dataclass(frozen=True)
class StackRow:
    """A stack as `stacks list` shows it; a file left out of the catalog has `invalid` set."""

    stack: str
    kind: str
    image: str
    model: str
    draft: str
    memory: float | None  # its share of unified memory
    port: int | None
    refused: bool  # the image policy refuses its image
    policy: str  # the policy's verdict, or why it refuses
    invalid: str | None = None  # why its file is left out
    source: str = "shipped"  # its layer: shipped, owner, or "owner, over shipped" (`Catalog.source`)


@dataclass(frozen=True)
class StackSeries:
    """One stack's figures at each of `Series.at` (None: its engine did not answer, or served nothing)."""

    tps: tuple[float | None, ...]  # tokens generated per second since the sample before
    ttft_p50_ms: tuple[float | None, ...]  # median time to first token since the sample before
    in_flight: tuple[int, ...]  # requests forwarded to its engine, at the sample
    queued: tuple[int, ...]  # requests accepted and waiting at its concurrency cap


@dataclass(frozen=True)
class Series:
    """The dashboard's last minutes, sampled by the daemon: each stack's figures, unified memory
    as shares (awake, parked, free) under the ceiling, and the alias switches in the window."""

    at: tuple[float, ...]  # unix seconds of each sample
    stacks: dict[str, StackSeries]
    awake: tuple[float, ...]
    parked: tuple[float, ...]
    free: tuple[float, ...]
    ceiling: float
    switches: tuple[tuple[float, str], ...] = ()  # (when, "primary: a → b")


@dataclass(frozen=True)
class RunRow:
    id: int
    stack: str
    profile: str
    started: float
    verdict: str | None
    rows: int


@dataclass(frozen=True)
class ReportRow:
    id: str  # reports/<folder> or bench/<folder>
    file: str  # its page
    time: float


@dataclass(frozen=True)
class DeploymentRow:
    id: int
    stack: str
    phase: str
    fingerprint: str | None
    started: float
    finished: float | None
    error: str | None
    transitions: tuple[tuple[str, float, str], ...]  # phase, when, detail


@dataclass(frozen=True)
class EventRow:
    at: float
    stack: str
    kind: str
    detail: str


@dataclass(frozen=True)
class BanRow:
    ref: str
    reason: str
    date: str | None  # ISO


@dataclass(frozen=True)
class History:
    deployments: tuple[DeploymentRow, ...]
    events: tuple[EventRow, ...]
    switches: tuple[dict[str, Any], ...]  # each switch as the store recorded it (its plan, outcome, timings)
    bans: tuple[BanRow, ...]
