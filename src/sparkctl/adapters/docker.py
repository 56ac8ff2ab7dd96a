"""The Docker engine, through the `docker` SDK: containers from plans, found by labels.

Every SDK exception is translated into a `DockerError` naming the call, the HTTP status and
the engine's explanation. Built once by the CLI or the daemon from settings.
"""

from __future__ import annotations

import asyncio
import io
import tarfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
import requests
from docker.types import DeviceRequest, Mount

from sparkctl import instance as instances
from sparkctl.adapters.retry import transient
from sparkctl.container import LABEL_STACK, Container, EngineFacts, Event, Image, Inspected
from sparkctl.errors import DockerError, TransientError
from sparkctl.policy.images import mirrored, parse_ref
from sparkctl.spec.render import ContainerPlan

if TYPE_CHECKING:
    import aiohttp


class TransientDockerError(DockerError, TransientError):
    """The engine or a registry behind it failed in a way a retry may fix (5xx)."""


class DockerEngine:
    """The handle on one Docker endpoint, seen as one sparkctl instance sees it: `containers()`
    lists only the instance's own, and everything `create()` makes carries its label. Everything
    that talks to an engine (compose projects too) is addressed through a handle; another host
    is another handle, not a host argument threaded through the callers."""

    def __init__(self, base_url: str | None = None, *, instance: str = instances.DEFAULT, timeout: int = 120) -> None:
        self.base_url, self.instance, self.timeout = base_url, instance, timeout

    @property
    def _scratch(self) -> dict[str, str]:
        """Labels of a throwaway container (a file read, a probe): the instance's cleanup finds it
        even if the process that made it was killed before removing it."""
        return {instances.LABEL: self.instance, "sparkctl.scratch": "1"}

    @cached_property
    def client(self) -> docker.DockerClient:
        """Connected on first use, so a daemon can start while the engine is still coming up."""
        with _translated("connect to the Docker engine"):
            if self.base_url:
                return docker.DockerClient(base_url=self.base_url, timeout=self.timeout)
            return docker.from_env(timeout=self.timeout)

    def create(self, plan: ContainerPlan, *, labels: dict[str, str] | None = None) -> str:
        """Create (not start) the planned container; returns its id. The API's own call: the
        SDK's `containers.create` inspects the new container too, a round trip nobody reads."""
        with _translated(f"create container {plan.name} from {plan.image}"):
            api = self.client.api
            host = api.create_host_config(
                network_mode=plan.network_mode,
                ipc_mode=plan.ipc_mode,
                shm_size=plan.shm_size,
                mounts=[Mount(m.target, m.source, type="bind", read_only=m.read_only) for m in plan.mounts],
                device_requests=_gpus(plan.gpus),
                init=plan.init,
            )
            return api.create_container(
                plan.image,
                command=list(plan.command),
                entrypoint=list(plan.entrypoint) if plan.entrypoint else None,
                name=plan.name,
                environment=dict(plan.env),
                labels={**plan.labels, **(labels or {}), instances.LABEL: self.instance},
                stdin_open=plan.stdin_open,
                host_config=host,
            )["Id"]

    def open_gate(self, name_or_id: str) -> None:
        """Let a gated container's engine start (`ContainerPlan.gated`): one line on its stdin.
        The line waits in the stdin pipe if the gate's shell has not reached its `read` yet."""
        with _translated(f"open the gate of container {name_or_id}"):
            sock = self.client.api.attach_socket(name_or_id, params={"stdin": 1, "stream": 1})
            try:  # the SDK's SocketIO reads only: its socket writes (as the SDK's own tests do)
                getattr(sock, "_sock", sock).sendall(b"\n")
            finally:
                sock.close()

    def entrypoint(self, image: str) -> tuple[str, ...] | None:
        """The image's ENTRYPOINT (None if it has none)."""
        info = self.image(image)
        if info is None:
            raise DockerError(f"image {image} is not on this engine")
        return info.entrypoint

    @transient()
    def registry_digest(self, ref: str, *, mirrors: Mapping[str, str] = {}) -> str:
        """The manifest digest the registry (or its mirror) serves for `ref` now."""
        source = mirrored(parse_ref(ref), mirrors)
        with _translated(f"resolve {source} at its registry"):
            return self.client.images.get_registry_data(source).id

    def pull(self, repository: str, digest: str, *, on_layer: Callable[[str, int, int], None] | None = None) -> None:
        """Pull `repository@digest`, reporting (layer id, bytes done, bytes total) as layers move."""
        with _translated(f"pull {repository}@{digest}"):
            for event in self.client.api.pull(repository, tag=digest, stream=True, decode=True):
                if "error" in event:
                    raise DockerError(f"pull {repository}@{digest}: {event['error']}")
                detail = event.get("progressDetail") or {}
                if on_layer and event.get("id") and detail.get("total"):
                    on_layer(event["id"], detail.get("current", 0), detail["total"])

    def local_image_id(self, ref: str, *, built_here: bool = False) -> str | None:
        """The id of the image `ref` names on this engine, or None if it has none; with
        `built_here`, only if it never came from a registry (it has no repo digest)."""
        info = self.image(ref)
        if info is None:
            return None
        return None if built_here and info.repo_digests else info.id

    def image(self, ref: str) -> Image | None:
        """Docker's record of the image `ref` names, or None."""
        try:
            return Image.from_inspect(self.client.api.inspect_image(ref))
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as e:
            raise DockerError(f"inspect image {ref}: {e.explanation or e}") from e

    def run_once(self, image: str, entrypoint: list[str], command: list[str]) -> str:
        """Run a throwaway container (no network) and return its stdout; fails with its output."""
        with _translated(f"run {' '.join(entrypoint)} in {image}"):
            container = self.client.containers.create(image, command, entrypoint=entrypoint, network_mode="none",
                                                      labels=self._scratch)
            try:
                container.start()
                status = container.wait(timeout=120)["StatusCode"]
                out = container.logs(stdout=True, stderr=False).decode(errors="replace")
                if status != 0:
                    err = container.logs(stdout=False, stderr=True).decode(errors="replace")
                    last = "\n".join(err.strip().splitlines()[-30:])
                    raise DockerError(f"run {' '.join(entrypoint)} in {image}: exit {status}: {last}")
                return out
            finally:
                container.remove(force=True)

    def read_files(self, image: str, paths: list[str]) -> dict[str, bytes | None]:
        """Copy files out of an image through a created, never-started container (None: absent)."""
        found: dict[str, bytes | None] = {}
        with _translated(f"read files from {image}"):
            container = self.client.containers.create(image, ["true"], entrypoint=["true"], network_mode="none",
                                                      labels=self._scratch)
        try:
            for path in paths:
                try:
                    stream, _ = container.get_archive(path)
                except docker.errors.NotFound:
                    found[path] = None
                    continue
                with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                    member = tar.next()
                    handle = tar.extractfile(member) if member and member.isfile() else None
                    found[path] = handle.read() if handle else None
        finally:
            container.remove(force=True)
        return found

    @transient()  # runc can fail to set a container up under load ("read init-p: connection reset")
    def start(self, name_or_id: str) -> None:
        with _translated(f"start container {name_or_id}"):
            self.client.api.start(name_or_id)

    def kill(self, name_or_id: str) -> None:
        """SIGKILL the container's processes at once (no grace period); returns once it stopped.
        One that is not running (it died on its own) is left as it is."""
        with _translated(f"kill container {name_or_id}"):
            try:
                self.client.api.kill(name_or_id)
            except docker.errors.APIError as e:
                if "is not running" not in str(e):
                    raise
            self.client.api.wait(name_or_id, timeout=30)

    def logs(self, name_or_id: str, *, tail: int = 30) -> str:
        with _translated(f"read the logs of {name_or_id}"):
            return self.client.api.logs(name_or_id, tail=tail).decode(errors="replace")

    async def follow_logs(self, name_or_id: str, *, tail: int = 30) -> AsyncIterator[bytes]:
        """The container's log (its last `tail` lines, then following) as byte chunks, read on the
        event loop: a follow holds no thread however long it lasts (the SDK's stream blocks one
        until the next line). The first chunk is empty, once Docker has accepted the follow, so a
        caller can answer Docker's refusal before it starts a stream of its own. Closing the
        iterator (`aclose()`) closes its connection to Docker."""
        import aiohttp  # here: a CLI command that does not follow starts 0.1 s faster

        call = f"follow the logs of {name_or_id}"
        connector, base = self._loop_endpoint(call)
        try:
            async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=self.timeout)) as session:
                async with session.get(f"{base}/containers/{name_or_id}/json") as found:
                    tty = (await _docker_json(found, call))["Config"]["Tty"]
                query = {"follow": "1", "stdout": "1", "stderr": "1", "tail": str(tail)}
                async with session.get(f"{base}/containers/{name_or_id}/logs", params=query) as answer:
                    await _docker_json(answer, call, body=False)
                    yield b""
                    if tty:  # a terminal's output comes raw
                        async for chunk in answer.content.iter_any():
                            yield chunk
                        return
                    while True:  # else in frames: stream (1 byte), 3 zero bytes, length (4 bytes), payload
                        try:
                            head = await answer.content.readexactly(8)
                            yield await answer.content.readexactly(int.from_bytes(head[4:], "big"))
                        except asyncio.IncompleteReadError:
                            return
        except aiohttp.ClientError as e:
            raise TransientDockerError(f"{call}: cannot reach the Docker engine ({type(e).__name__}: {e})") from e

    def _loop_endpoint(self, call: str) -> tuple[aiohttp.BaseConnector, str]:
        """A connector to the engine the SDK client talks to, and the versioned base URL of its API."""
        import aiohttp

        api = self.client.api
        socket_path = getattr(getattr(api, "_custom_adapter", None), "socket_path", None)
        if socket_path:
            return aiohttp.UnixConnector(path=socket_path), f"http://docker/v{api.api_version}"
        if api.base_url.startswith("http://"):
            return aiohttp.TCPConnector(), f"{api.base_url}/v{api.api_version}"
        raise DockerError(f"{call}: only a unix socket or plain TCP Docker endpoint can be followed "
                          f"(this one is {api.base_url}); read the log without following")

    def events(self) -> Events:
        """The engine's container events (die, oom, start, destroy, ...) of sparkctl's containers,
        as they happen; `close()` on the returned stream ends it."""
        return Events(self.client.events(decode=True, filters={"type": "container", "label": LABEL_STACK}))

    @transient()
    def stop(self, name_or_id: str, *, timeout: int = 30) -> None:
        """Stop the container; returns once Docker's container list agrees. The list is a copy
        the engine writes after the container is marked stopped, which is what ends `stop`, and
        before it sends the `die` event: so a stop of a running container waits for its `die`.
        Admission reads the list, and would count a stopped stack's memory."""
        since = time.time()
        with _translated(f"stop container {name_or_id}"):
            if not self.client.api.inspect_container(name_or_id)["State"]["Running"]:
                return
            died = self.client.events(decode=True, since=since, until=since + timeout + 30,
                                      filters={"type": "container", "container": name_or_id, "event": "die"})
            try:
                self.client.api.stop(name_or_id, timeout=timeout)
                next(died, None)  # its `die`, or the stream's end at `until`
            finally:
                died.close()

    def rename(self, name_or_id: str, new_name: str) -> None:
        with _translated(f"rename container {name_or_id} to {new_name}"):
            self.client.api.rename(name_or_id, new_name)

    def facts(self) -> EngineFacts:
        """The engine's version, runtimes (`nvidia`: containers can get GPUs) and root dir."""
        with _translated("read the engine's version and info"):
            return EngineFacts.from_answers(self.client.version(), self.client.info())

    def inspect(self, name_or_id: str) -> Inspected:
        with _translated(f"inspect container {name_or_id}"):
            return Inspected.from_inspect(self.client.api.inspect_container(name_or_id))

    def pids(self, name_or_id: str) -> list[int]:
        """The container's processes (host pids), as its engine lists them from the container's
        cgroup (`docker top`); none when it is not running."""
        with _translated(f"list the processes of container {name_or_id}"):
            try:
                top = self.client.api.top(name_or_id)
            except docker.errors.APIError as e:
                if "is not running" in str(e):
                    return []
                raise
        column = top["Titles"].index("PID")
        return [int(row[column]) for row in top.get("Processes") or []]

    def remove(self, name_or_id: str) -> bool:
        """Remove a container (running or not); False if there was none (or it is already going)."""
        try:
            with _translated(f"remove container {name_or_id}"):
                self.client.api.remove_container(name_or_id, force=True, v=True)
        except DockerError as e:
            if "No such container" in str(e) or "already in progress" in str(e):
                return False
            raise
        return True

    def containers(self, stack: str | None = None, **labels: str) -> list[Container]:
        """This instance's containers (any state), of one stack if given, carrying all given labels."""
        return [c for c in self._sparkctl(stack, labels) if c.instance == self.instance]

    def remove_scratch(self) -> int:
        """Remove throwaway containers this instance left behind (its process was killed); how many."""
        wanted = [f"{key}={value}" for key, value in self._scratch.items()]
        with _translated("list scratch containers"):
            found = self.client.api.containers(all=True, filters={"label": wanted})
        return sum(self.remove(c["Id"]) for c in found)

    def others(self) -> list[Container]:
        """Other instances' sparkctl containers on this engine: to mention, never to touch."""
        return [c for c in self._sparkctl(None, {}) if c.instance != self.instance]

    def _sparkctl(self, stack: str | None, labels: Mapping[str, str]) -> list[Container]:
        wanted = [f"{LABEL_STACK}={stack}" if stack else LABEL_STACK] + [f"{k}={v}" for k, v in labels.items()]
        with _translated("list containers"):
            return [Container.from_listing(c) for c in self.client.api.containers(all=True, filters={"label": wanted})]


def _gpus(gpus: str | int) -> list[DeviceRequest]:
    if gpus == "none":
        return []
    count = -1 if gpus == "all" else int(gpus)
    return [DeviceRequest(count=count, capabilities=[["gpu"]])]


class Events:
    """Docker's event stream, each event typed; `close()` ends a wait for the next one."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __iter__(self) -> Events:
        return self

    def __next__(self) -> Event:
        return Event.from_stream(next(self._stream))

    def close(self) -> None:
        self._stream.close()


async def _docker_json(answer: aiohttp.ClientResponse, call: str, *, body: bool = True) -> Any:
    """An answer of the engine's API checked as `_translated` checks the SDK's; its JSON body if `body`."""
    if answer.status >= 400:
        text = (await answer.text())[:300]
        kind = TransientDockerError if answer.status in (500, 502, 503, 504) and "not found" not in text.lower() \
            else DockerError
        raise kind(f"{call}: Docker said {answer.status}: {text.strip()}")
    return await answer.json() if body else None


@contextmanager
def _translated(call: str) -> Iterator[None]:
    try:
        yield
    except docker.errors.APIError as e:
        status = getattr(e.response, "status_code", "?")
        kind = TransientDockerError if status in (500, 502, 503, 504) and "not found" not in str(e).lower() \
            else DockerError
        raise kind(f"{call}: Docker said {status}: {e.explanation or e}") from e
    except requests.exceptions.ReadTimeout as e:
        raise DockerError(f"{call}: the Docker engine did not answer in time") from e
    except (docker.errors.DockerException, requests.exceptions.ConnectionError) as e:
        raise TransientDockerError(
            f"{call}: cannot reach the Docker engine ({type(e).__name__}). Is dockerd running and is "
            "DOCKER_HOST / SPARKCTL_DOCKER_HOST right?"
        ) from e
