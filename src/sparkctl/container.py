"""Docker's answers about sparkctl's containers and images, typed, and the labels that make a
container one of sparkctl's.

The Docker adapter turns each listing into a `Container`, each inspect into an `Inspected`, each
image record into an `Image` and each event into an `Event`; the pipeline, status, the
reconciler, the daemon and the host agent read these fields instead of Docker's dicts. Plain
models, imported by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkctl import instance as instances

LABEL_STACK = "sparkctl.stack"
LABEL_SPEC_HASH = "sparkctl.spec-hash"
LABEL_FINGERPRINT = "sparkctl.fingerprint"
LABEL_MEMORY = "sparkctl.gpu-memory"  # the fraction reserved, for admission without the stack file
# On a container a fleet host's agent deployed (`sparkctl fleet up`): the fleet owns it, so the
# daemon on the same host neither removes it as undesired nor routes it as a local stack.
LABEL_PLACED = "sparkctl.placed"
LABEL_RANK = "sparkctl.rank"  # a multi-node stack's rank (0 serves HTTP)
LABEL_RELAY = "sparkctl.relay"  # a placed engine's port, which its host's agent relays (gateway/relay.py)


@dataclass(frozen=True)
class Container:
    id: str
    name: str
    stack: str
    instance: str
    labelled: bool  # carries an instance label (containers from before instances do not)
    state: str  # Docker's: created, running, exited, ...
    created: float  # epoch seconds
    fingerprint: str | None
    spec_hash: str | None
    memory: float | None  # the unified-memory share it reserved
    placed: bool = False  # deployed by the fleet's agent (LABEL_PLACED), not by this host's daemon
    relay: int | None = None  # the port its host's agent relays (LABEL_RELAY): a placed engine that serves HTTP

    @property
    def running(self) -> bool:
        return self.state == "running"

    @classmethod
    def from_listing(cls, raw: dict[str, Any]) -> Container:
        """From one entry of Docker's container list (`GET /containers/json`)."""
        labels = raw.get("Labels") or {}
        memory = labels.get(LABEL_MEMORY)
        return cls(id=raw["Id"], name=(raw.get("Names") or ["/"])[0].lstrip("/"), stack=labels[LABEL_STACK],
                   instance=labels.get(instances.LABEL, instances.DEFAULT), labelled=instances.LABEL in labels,
                   state=raw.get("State", ""), created=float(raw.get("Created", 0)),
                   fingerprint=labels.get(LABEL_FINGERPRINT), spec_hash=labels.get(LABEL_SPEC_HASH),
                   memory=float(memory) if memory else None, placed=LABEL_PLACED in labels,
                   relay=int(labels[LABEL_RELAY]) if labels.get(LABEL_RELAY, "").isdigit() else None)


@dataclass(frozen=True)
class Inspected:
    """One container as `docker inspect` reports it: what sparkctl reads of it."""

    status: str  # Docker's: created, running, exited, dead, ...
    exit_code: int
    oom_killed: bool
    labels: dict[str, str]
    image_id: str  # the image it runs
    image_ref: str  # the reference it was created from
    command: tuple[str, ...]  # its entrypoint, then its command

    @property
    def stack(self) -> str | None:
        return self.labels.get(LABEL_STACK)

    @classmethod
    def from_inspect(cls, raw: dict[str, Any]) -> Inspected:
        state, config = raw.get("State") or {}, raw.get("Config") or {}
        return cls(status=state.get("Status", ""), exit_code=int(state.get("ExitCode") or 0),
                   oom_killed=bool(state.get("OOMKilled")), labels=config.get("Labels") or {},
                   image_id=raw.get("Image", ""), image_ref=config.get("Image", ""),
                   command=(*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])))


@dataclass(frozen=True)
class Image:
    """An image as Docker records it (`docker image inspect`)."""

    id: str
    repo_digests: tuple[str, ...]  # `repository@sha256:...`, one per registry it came from
    entrypoint: tuple[str, ...] | None

    @classmethod
    def from_inspect(cls, raw: dict[str, Any]) -> Image:
        entrypoint = (raw.get("Config") or {}).get("Entrypoint")
        return cls(id=raw["Id"], repo_digests=tuple(raw.get("RepoDigests") or ()),
                   entrypoint=tuple(entrypoint) if entrypoint is not None else None)


@dataclass(frozen=True)
class EngineFacts:
    """The Docker engine as `docker version` and `docker info` report it."""

    version: str
    api_version: str
    runtimes: tuple[str, ...]  # `nvidia` among them: containers can get GPUs
    root_dir: str  # where images and containers live, on the engine's host

    @classmethod
    def from_answers(cls, version: dict[str, Any], info: dict[str, Any]) -> EngineFacts:
        return cls(version=version.get("Version", "?"), api_version=version.get("ApiVersion", "?"),
                   runtimes=tuple(sorted(info.get("Runtimes") or {})), root_dir=info.get("DockerRootDir", ""))


@dataclass(frozen=True)
class Event:
    """A container event from Docker's stream: die, oom, start, stop, destroy, ..."""

    action: str
    container: str
    labels: dict[str, str]  # the container's labels, with Docker's `exitCode` on a death
    exit_code: int | None

    @property
    def stack(self) -> str | None:
        return self.labels.get(LABEL_STACK)

    @classmethod
    def from_stream(cls, raw: dict[str, Any]) -> Event:
        attributes = (raw.get("Actor") or {}).get("Attributes") or {}
        code = attributes.get("exitCode")
        return cls(action=raw.get("Action", ""), container=raw.get("id", ""), labels=attributes,
                   exit_code=int(code) if code else None)
