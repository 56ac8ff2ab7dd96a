"""A fleet node as its backend (Ray today) reports it, and what a placement got: plain models.

The Ray adapter turns the cluster's node table into `Node`s and a placement group into a
`Placement`; the fleet layer joins them with the inventory for `sparkctl fleet status`. The
names below (the per-Spark resource, the labels) are how sparkctl recognises its own nodes,
the way `container.py`'s labels recognise its containers. Imported by every layer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

T = TypeVar("T")

LABEL_HOST = "sparkctl.dev/host"  # the inventory name a node was started as
LABEL_INTERFACE = "sparkctl.dev/serving-interface"
LABEL_ADDRESS = "sparkctl.dev/serving-address"
RESOURCE_PREFIX = "spark:"  # one unit of `spark:<host>` per Spark: what placement pins a bundle to
# Ray's label values: up to 63 characters, alphanumeric at both ends, `-_.` inside.
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


def host_resource(host: str) -> str:
    """The custom resource a Spark's node advertises (one unit), so a bundle can name the host."""
    return f"{RESOURCE_PREFIX}{host}"


class NodeState(StrEnum):
    ALIVE = "alive"
    DEAD = "dead"
    UNKNOWN = "unknown"  # the backend does not know the node, or did not answer

    def is_up(self) -> bool:
        return self is NodeState.ALIVE


@dataclass(frozen=True)
class Node:
    """One node in the backend's table (a dead node stays listed with its last resources)."""

    node_id: str
    address: str
    state: NodeState
    resources: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    head: bool = False
    died_at: float | None = None  # epoch seconds when the backend declared it dead

    @property
    def host(self) -> str | None:
        """The inventory name it was started as: its label, else its `spark:<host>` resource."""
        if self.labels.get(LABEL_HOST):
            return self.labels[LABEL_HOST]
        named = [r.removeprefix(RESOURCE_PREFIX) for r in self.resources if r.startswith(RESOURCE_PREFIX)]
        return named[0] if len(named) == 1 else None

    @property
    def memory_bytes(self) -> int | None:
        memory = self.resources.get("memory")
        return int(memory) if memory is not None else None


@dataclass(frozen=True)
class NodeLaunch:
    """Everything a backend needs to start this Spark's node; nothing is left to guess."""

    host: str
    address: str
    port: int  # the head's control port; a worker's first port
    head: str | None  # the head's endpoint to join; None starts the head itself
    memory_bytes: int
    temp_dir: Path
    log_file: Path
    object_store_bytes: int
    labels: dict[str, str] = field(default_factory=dict)
    num_cpus: int | None = None
    dead_after: float | None = None  # seconds of silence before the head declares a node dead

    @property
    def endpoint(self) -> str:
        """The head's endpoint: the one joined, or this node's own when it is the head."""
        return self.head or (f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}")


@dataclass(frozen=True)
class NodeRecord:
    """What a start left: the cluster to find again, and the backend's handle on exactly the
    processes it started (for Ray: their session and pids)."""

    host: str
    address: str
    head: str  # the head's endpoint
    is_head: bool
    temp_dir: str
    handle: dict[str, Any]


@dataclass(frozen=True)
class Placement:
    """A placement group the backend created: which node holds each bundle, in bundle order."""

    name: str
    strategy: str
    nodes: tuple[str, ...]  # node ids, one per bundle ("" for a bundle not placed yet)
    placed: bool = True  # False while the backend re-places bundles whose node died


# -- host agents ------------------------------------------------------------------------------------
AGENT_CLASS = "sparkctl.fleet.hostagent:HostAgent"  # what each agent actor runs
AGENT_PREFIX = "sparkctl-agent-"  # pinned to its host by the node label LABEL_HOST, not by `spark:<host>`


def agent_name(host: str) -> str:
    """The detached actor that owns a host's containers, in the instance's namespace."""
    return f"{AGENT_PREFIX}{host}"


@dataclass(frozen=True)
class AgentSpec:
    """What a host's agent is started with: its host, that host's local Docker engine (None: the
    host's default socket) and serving address (where its engines listen; None: loopback),
    serving one sparkctl instance."""

    host: str
    docker_url: str | None
    instance: str
    address: str | None = None


# -- the host agent's API: one typed call each, one typed answer each -------------------------------
# A call crosses Ray as its method name and its fields, an answer as its fields: plain data, so
# nothing of sparkctl's is unpickled on the other side. `HostAgent` implements `AgentAPI`; the
# backend decodes each answer into the call's `answer` type.
@dataclass(frozen=True)
class Prepared:
    """What a host would run (the fingerprint's parts: image digest, model and draft commits,
    patch hash, engine env), after fetching without starting."""

    host: str
    parts: dict[str, str]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Started:
    host: str
    url: str  # where the head's gateway reaches the engine (the host's relay, or its loopback)
    fingerprint: str
    changed: bool
    timings: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostContainer:
    host: str
    stack: str
    name: str
    state: str  # Docker's: running, exited, created, ...
    image: str
    placed: bool = False
    repo_digest: str | None = None


@dataclass(frozen=True)
class HostImage:
    host: str
    present: bool
    image_id: str | None = None
    repo_digest: str | None = None  # None: the host's Docker records none (e.g. after `docker load`)


@dataclass(frozen=True)
class Removed:
    host: str
    stack: str
    removed: tuple[str, ...]  # the names its Docker removed, confirmed gone
    confirmed: bool = True


@dataclass(frozen=True)
class Describe:
    """Who the agent is (what `ensure` compares with what it wants)."""

    method: ClassVar[str] = "describe"
    answer: ClassVar[type] = AgentSpec


@dataclass(frozen=True)
class Prepare:
    """Fetch and patch the stack as `up` would, start nothing."""

    stack: str
    spec: str  # the head's spec hash of the stack file: the host's must be the same
    method: ClassVar[str] = "prepare"
    answer: ClassVar[type] = Prepared


@dataclass(frozen=True)
class Up:
    """Deploy the stack once what the host would run is `expected`; with `ranks` (host -> rank),
    the host's rank of a multi-node group."""

    stack: str
    spec: str
    expected: dict[str, str]
    ranks: dict[str, Any] | None = None
    method: ClassVar[str] = "up"
    answer: ClassVar[type] = Started


@dataclass(frozen=True)
class Containers:
    """The instance's containers on the host, as its Docker lists them now."""

    method: ClassVar[str] = "containers"
    answer: ClassVar[type] = HostContainer
    many: ClassVar[bool] = True


@dataclass(frozen=True)
class ImageDigest:
    ref: str
    method: ClassVar[str] = "image_digest"
    answer: ClassVar[type] = HostImage


@dataclass(frozen=True)
class Pull:
    ref: str  # repository@sha256:...
    method: ClassVar[str] = "pull"
    answer: ClassVar[type] = HostImage


@dataclass(frozen=True)
class Remove:
    stack: str
    method: ClassVar[str] = "remove"
    answer: ClassVar[type] = Removed


AgentCall = Describe | Prepare | Up | Containers | ImageDigest | Pull | Remove
CALLS: dict[str, type] = {c.method: c for c in (Describe, Prepare, Up, Containers, ImageDigest, Pull, Remove)}


class AgentAPI(Protocol):
    """A host agent, as the head calls it: one method per call type, named by its `method`."""

    def describe(self, call: Describe) -> AgentSpec: ...

    def prepare(self, call: Prepare) -> Prepared: ...

    def up(self, call: Up) -> Started: ...

    def containers(self, call: Containers) -> list[HostContainer]: ...

    def image_digest(self, call: ImageDigest) -> HostImage: ...

    def pull(self, call: Pull) -> HostImage: ...

    def remove(self, call: Remove) -> Removed: ...


def encode(answer: Any) -> Any:
    """An answer as plain data, to cross Ray."""
    return [asdict(a) for a in answer] if isinstance(answer, list) else asdict(answer)


def decode(call: AgentCall, value: Any) -> Any:
    """The plain answer to `call` as its typed value (a list for `Containers`)."""
    def one(data: dict[str, Any]) -> Any:
        return call.answer(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    return [one(v) for v in value] if getattr(call, "many", False) else one(value)


@dataclass(frozen=True)
class AgentAnswer(Generic[T]):
    """One host's answer to a call on its agent: the typed value, or why there was none."""

    host: str
    value: T | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def unreachable(answers: Sequence[AgentAnswer]) -> dict[str, str]:
    """The hosts that gave no answer, with why: kept beside any result, so a silent host is never
    passed off as an empty one."""
    return {a.host: a.error or "" for a in answers if not a.ok}
