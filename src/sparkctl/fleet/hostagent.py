"""A Spark's host agent: the object that owns one host's containers through that host's LOCAL
Docker engine, run as a detached Ray actor (`sparkctl-agent-<host>`) pinned to the host.

The class is plain Python, which `adapters.ray` makes an actor by name (`node.AGENT_CLASS`).
It implements `node.AgentAPI`: each method takes one typed call and returns a typed answer, and
`call` is what crosses Ray, plain data both ways (`node.encode`). Docker is reached only through
`DockerEngine`, which lists only the instance's own containers, so an agent never sees or touches
another instance's.

A placed stack is deployed by the same pipeline `sparkctl up` runs on one Spark, with this host's
settings and Docker. Its engine listens on the host's loopback; the agent relays it on the host's
serving address to the head's gateway, which shows the fleet's relay credential
(`gateway/relay.py`): nothing of an engine is reachable from another host without it, and vLLM's
dev endpoints not at all. A restarted agent relays again every engine its host runs (their
containers carry the port, `LABEL_RELAY`). `prepare` fetches without starting, so the head can
compare what every chosen host would run before any of them starts.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from sparkctl.adapters import processes
from sparkctl.adapters.docker import DockerEngine
from sparkctl.container import Image, Inspected
from sparkctl.errors import DockerError, SparkctlError
from sparkctl.fleet.local import relay_key
from sparkctl.fleet.membership import token_path
from sparkctl.gateway.relay import Relays
from sparkctl.node import (
    CALLS,
    AgentSpec,
    Containers,
    Describe,
    HostContainer,
    HostImage,
    ImageDigest,
    Prepare,
    Prepared,
    Pull,
    Remove,
    Removed,
    Started,
    Up,
    encode,
)
from sparkctl.policy.images import parse_ref
from sparkctl.settings import Settings

if TYPE_CHECKING:
    from sparkctl.deploy.pipeline import Deployer
    from sparkctl.spec.models import Stack
    from sparkctl.spec.ranks import Rank

CONFIRM_WITHIN = 30.0  # seconds `remove` waits for the host's Docker to list none of the stack's containers


class HostAgent:
    def __init__(self, *, host: str, docker_url: str | None, instance: str, address: str | None = None) -> None:
        self.host, self.docker_url, self.instance, self.address = host, docker_url, instance, address
        self.engine = DockerEngine(docker_url, instance=instance, timeout=60)
        self.settings = Settings(docker_host=docker_url, instance=instance)
        self.relays: Relays | None = None  # made on the first call (the key and Docker are read then)

    def call(self, method: str, fields: dict[str, Any]) -> Any:
        """What the head calls: the `method` call with its `fields`, answered as plain data, with
        sparkctl's errors turned into plain ones that cross Ray whole (some of ours take several
        arguments and would not unpickle there)."""
        try:
            if self.relays is None and self.address is not None:
                self._relay_running()
            return encode(getattr(self, method)(CALLS[method](**fields)))
        except SparkctlError as e:
            raise RuntimeError(str(e)) from None

    def describe(self, call: Describe) -> AgentSpec:
        return AgentSpec(host=self.host, docker_url=self.docker_url, instance=self.instance, address=self.address)

    def prepare(self, call: Prepare) -> Prepared:
        """Pull the stack's image by digest, fetch its weights and patch, as `up` would; start
        nothing. What this host would run: the fingerprint's parts (image digest, model and draft
        commits, patch hash, engine env)."""
        deployer, served = self._deployer(call.stack, call.spec)
        prepared = deployer.prepare(served)
        return Prepared(host=self.host, parts=prepared.parts, notes=tuple(deployer.reporter.notes))

    def up(self, call: Up) -> Started:
        """Deploy the stack here with the single-Spark pipeline, once what this host would run is
        what the head `expected` (the parts every chosen host agreed on); the engine's URL. With
        `ranks` (host -> rank), this host's rank of a multi-node group, on its own interface."""
        deployer, served = self._deployer(call.stack, call.spec)
        if call.ranks is not None:
            if self.host not in call.ranks:
                raise SparkctlError(f"the group's ranks name no rank for host {self.host}")
            deployer = dataclasses.replace(deployer, rank=self._rank(call.ranks[self.host]))
        found = deployer.prepare(served).parts
        if differ := {k: (v, found.get(k)) for k, v in call.expected.items() if found.get(k) != v}:
            raise SparkctlError(f"host {self.host} would run something else than agreed: "
                                + "; ".join(f"{k} {mine} here, {v} agreed" for k, (v, mine) in differ.items()))
        result = deployer.up(call.stack)
        self._confine(call.stack, served.port, every_port=call.ranks is None)
        url = result.url
        if self.address is not None and (call.ranks is None or not deployer.rank.headless):
            url = self._relay(served.port, result.url)
        return Started(host=self.host, url=url, fingerprint=result.fingerprint, changed=result.changed,
                       timings=result.timings, notes=tuple(deployer.reporter.notes))

    def containers(self, call: Containers) -> list[HostContainer]:
        """This instance's containers on the host, as its Docker reports them now."""
        listed = []
        for container in self.engine.containers():
            info = self._inspect(container.id)
            image = self._image(info.image_id) if info else None
            image_ref = info.image_ref if info else ""
            listed.append(HostContainer(host=self.host, stack=container.stack, name=container.name,
                                        state=container.state, image=image_ref, placed=container.placed,
                                        repo_digest=_digest_for(image_ref, image.repo_digests) if image else None))
        return listed

    def image_digest(self, call: ImageDigest) -> HostImage:
        """What the host's Docker holds under the ref: its image id and the RepoDigest of the ref's
        repository (None when `docker load` lost it, or the host lacks the image)."""
        image = self._image(call.ref)
        if image is None:
            return HostImage(host=self.host, present=False)
        return HostImage(host=self.host, present=True, image_id=image.id,
                         repo_digest=_digest_for(call.ref, image.repo_digests))

    def pull(self, call: Pull) -> HostImage:
        """Pull `repository@sha256:...` into the host's Docker; then what it holds."""
        name = parse_ref(call.ref)
        if not name.digest:
            raise DockerError(f"pull {call.ref} on host {self.host}: pull by digest only (`repository@sha256:...`)")
        self.engine.pull(call.ref.split("@", 1)[0], name.digest)
        return self.image_digest(ImageDigest(call.ref))

    def remove(self, call: Remove) -> Removed:
        """Remove the stack's containers; returns once the host's Docker lists none of them."""
        stack = call.stack
        for container in self.engine.containers(stack):
            if container.relay is not None and self.relays is not None:
                self.relays.drop(self.address, container.relay)
        removed = [c.name for c in self.engine.containers(stack) if self.engine.remove(c.id)]
        deadline = time.monotonic() + CONFIRM_WITHIN
        while left := self.engine.containers(stack):
            if time.monotonic() > deadline:
                raise DockerError(f"remove stack {stack} on host {self.host}: Docker still lists "
                                  f"{', '.join(c.name for c in left)} after {CONFIRM_WITHIN:g} s")
            time.sleep(0.05)
        return Removed(host=self.host, stack=stack, removed=tuple(removed))

    def _confine(self, stack: str, port: int, *, every_port: bool) -> None:
        """Remove the stack here, refused, when its containers listen beyond loopback, as the
        kernel reports it (whatever its flags, entrypoint or env said). A multi-node rank's own
        traffic (torch, gloo) is on the host's serving address: there only the HTTP `port` is judged."""
        found = [listener for container in self.engine.containers(stack) if container.placed
                 for listener in processes.listening(self.engine.pids(container.id))]
        if wide := exposed(found, port=None if every_port else port):
            self.remove(Remove(stack))
            raise SparkctlError(
                f"stack {stack} on host {self.host}: its engine listens beyond loopback on "
                f"{', '.join(f'{w} (pid {w.pid})' for w in wide)}, so it was removed. "
                "A placed engine listens on its host's loopback only and is reached through the host's relay: "
                "look for a --host or a listener added by container.entrypoint, vllm.extra_args or container.env")

    def _deployer(self, name: str, spec: str) -> tuple[Deployer, Stack]:
        """The pipeline on this host's settings and Docker, its catalog holding `name` as served
        here; refused when this host's stack file is not the one the head placed (`spec`)."""
        from sparkctl.deploy.progress import RecordingReporter
        from sparkctl.spec.render import spec_hash
        from sparkctl.wiring import Wiring

        wiring = Wiring(self.settings, docker=self.engine)  # this agent's own handle on the host's Docker
        catalog = wiring.catalog()
        stack = catalog.stack(name)
        if spec_hash(stack) != spec:
            raise SparkctlError(f"host {self.host}'s stack file for {name} ({catalog.files.get(name)}) differs from "
                                f"the head's (spec {spec_hash(stack)} here, {spec} there): copy the head's file here")
        served = placeable(stack)
        deployer = dataclasses.replace(wiring.deployer(RecordingReporter(), catalog=catalog, parked=self._parked),
                                       placed=True)
        return deployer, served

    def _parked(self) -> dict[str, int]:
        """The stacks this host's own daemon keeps parked (they hold memory an admission counts): a
        read of its desired.yaml, which changes nothing."""
        from sparkctl.state import desired

        return desired.load(self.settings.state_dir / "desired.yaml").parked

    def _relay(self, port: int, engine: str) -> str:
        """Relay the engine at `engine` (on loopback) on this host's serving address; its URL there."""
        self.relays.ensure(self.address, port, engine)
        return f"http://[{self.address}]:{port}" if ":" in self.address else f"http://{self.address}:{port}"

    def _relay_running(self) -> None:
        """Start the relays with every engine this host runs (a restarted agent's are gone)."""
        processes.open_files()  # a relay's connections are files: as many as the host allows
        self.relays = Relays(relay_key(token_path(self.settings)),
                             unauthenticated=self.settings.fleet_relay_unauthenticated,
                             credential_within=self.settings.fleet_relay_credential_within)
        for container in self.engine.containers():
            if container.relay is not None and container.running:
                self._relay(container.relay, f"http://127.0.0.1:{container.relay}")

    def _rank(self, data: dict[str, Any]) -> Rank:
        """The rank the head asked for, refused unless it names this host and this host's
        interface holds the address (never another host's settings)."""
        from sparkctl.fleet.local import check_on_interface
        from sparkctl.spec.ranks import Rank, RankHost

        host = RankHost(**data["host"])
        if host.name != self.host:
            raise SparkctlError(f"rank {data['index']} is for host {host.name}, not {self.host}")
        check_on_interface(host.interface, host.address, self.host)
        return Rank(index=int(data["index"]), master=str(data["master"]), host=host)

    def _inspect(self, container_id: str) -> Inspected | None:
        try:
            return self.engine.inspect(container_id)
        except DockerError:
            return None  # removed between the listing and now

    def _image(self, ref: str) -> Image | None:
        try:
            return self.engine.image(ref)
        except DockerError as e:
            raise DockerError(f"{e} (on host {self.host})") from None


def placeable(stack: Stack) -> Stack:
    """The stack, checked for a fleet host: a vllm stack whose engine listens on loopback (its
    host's agent relays it to the head's gateway, with the fleet's credential)."""
    from sparkctl.spec.models import Kind

    if stack.kind is not Kind.VLLM or stack.vllm is None:
        raise SparkctlError(f"{stack.name} is a {stack.kind} stack: only vllm stacks are placed across a fleet "
                            "(run a compose project with `sparkctl up` on its Spark)")
    if any(risk == "all-interfaces" for risk, _ in stack.risks()):
        raise SparkctlError(f"{stack.name}'s engine would listen beyond loopback (vllm.host {stack.vllm.host}): a "
                            "placed engine listens on its host's loopback and is reached through the host's relay "
                            "(with the fleet's credential); remove the host setting to place it")
    return stack


def exposed(listeners: list[processes.Listener], *, port: int | None) -> list[processes.Listener]:
    """The listeners reachable from beyond the host (of `port` only, if given)."""
    return [listener for listener in listeners if not listener.loopback and port in (None, listener.port)]


def _digest_for(ref: str, repo_digests: tuple[str, ...]) -> str | None:
    """The RepoDigest that stands for `ref`: the digest it names if the image has it, else the
    first one of the ref's repository, else the only one; None when Docker records none."""
    entries = [entry.split("@", 1) for entry in repo_digests or [] if "@" in entry]
    repository, _, named = ref.partition("@")
    if ":" in repository.rsplit("/", 1)[-1]:
        repository = repository.rsplit(":", 1)[0]
    ours = [digest for repo, digest in entries if repo == repository]
    if named in ours:
        return named
    if ours:
        return ours[0]
    return entries[0][1] if len(entries) == 1 else None
