"""What the daemon's queries answer (`daemon/reads.py`, the API's `Queries`), as the CLI and the
dashboard read them: status rows, the stack list, engines' counters, benchmark runs, reports and
history. Sent as JSON (`dataclasses.asdict`); standard library only, like `wire`."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any


def from_fields(kind: type, record: Any) -> Any:
    """`kind` built from the keys of `record` that are its fields (a later version's extra keys are left)."""
    return kind(**{f.name: record[f.name] for f in fields(kind) if f.name in record})


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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Status:
        rows = tuple(replace(from_fields(StatusRow, row), kv=row.get("kv") and replace(
            from_fields(KvRow, row["kv"]), warnings=tuple(row["kv"]["warnings"]))) for row in data["stacks"])
        memory = data.get("memory")
        return replace(from_fields(cls, data), stacks=rows, memory=memory and from_fields(MemoryHeld, memory),
                       catalog=tuple(data.get("catalog", ())))


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
