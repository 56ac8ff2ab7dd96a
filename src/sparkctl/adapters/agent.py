"""A Spark's host agent: the object that owns one host's containers through that host's LOCAL
Docker engine, run as a detached Ray actor (`sparkctl-agent-<host>`) pinned to the host.

The class is plain Python; `adapters.ray` makes it an actor in its child process. Every method
takes and returns plain data (str, lists, dicts), so the head's driver needs none of sparkctl's
types to read the answers. Docker is reached only through `DockerEngine`, which lists only the
instance's own containers, so an agent never sees or touches another instance's.
"""

from __future__ import annotations

import time
from typing import Any

import docker.errors

from sparkctl.adapters.docker import DockerEngine
from sparkctl.errors import DockerError
from sparkctl.policy.images import parse_ref

CONFIRM_WITHIN = 30.0  # seconds `remove` waits for the host's Docker to list none of the stack's containers


class HostAgent:
    def __init__(self, *, host: str, docker_url: str | None, instance: str) -> None:
        self.host, self.docker_url, self.instance = host, docker_url, instance
        self.engine = DockerEngine(docker_url, instance=instance, timeout=60)

    def describe(self) -> dict[str, Any]:
        """Who this agent is: what `ensure_agents` compares with what it wants."""
        return {"host": self.host, "docker_url": self.docker_url, "instance": self.instance}

    def containers(self) -> list[dict[str, Any]]:
        """This instance's containers on the host, as its Docker reports them now."""
        listed = []
        for container in self.engine.containers():
            info = self._inspect(container.id)
            image_ref = (info or {}).get("Config", {}).get("Image", "")
            image = self._image((info or {}).get("Image", "")) if info else None
            listed.append({"host": self.host, "stack": container.stack, "name": container.name,
                           "state": container.state, "image": image_ref,
                           "repo_digest": _digest_for(image_ref, image["RepoDigests"]) if image else None})
        return listed

    def image_digest(self, ref: str) -> dict[str, Any]:
        """What the host's Docker holds under `ref`: its image id and the RepoDigest of the ref's
        repository (None when `docker load` lost it, or the host lacks the image)."""
        image = self._image(ref)
        if image is None:
            return {"host": self.host, "ref": ref, "present": False, "image_id": None, "repo_digest": None}
        return {"host": self.host, "ref": ref, "present": True, "image_id": image["Id"],
                "repo_digest": _digest_for(ref, image["RepoDigests"])}

    def pull(self, ref: str) -> dict[str, Any]:
        """Pull `repository@sha256:...` into the host's Docker; then what it holds."""
        name = parse_ref(ref)
        if not name.digest:
            raise DockerError(f"pull {ref} on host {self.host}: pull by digest only (`repository@sha256:...`)")
        self.engine.pull(ref.split("@", 1)[0], name.digest)
        return self.image_digest(ref)

    def remove(self, stack: str) -> dict[str, Any]:
        """Remove the stack's containers; returns once the host's Docker lists none of them."""
        removed = [c.name for c in self.engine.containers(stack) if self.engine.remove(c.id)]
        deadline = time.monotonic() + CONFIRM_WITHIN
        while left := self.engine.containers(stack):
            if time.monotonic() > deadline:
                raise DockerError(f"remove stack {stack} on host {self.host}: Docker still lists "
                                  f"{', '.join(c.name for c in left)} after {CONFIRM_WITHIN:g} s")
            time.sleep(0.05)
        return {"host": self.host, "stack": stack, "removed": removed, "confirmed": True}

    def _inspect(self, container_id: str) -> dict[str, Any] | None:
        try:
            return self.engine.inspect(container_id)
        except DockerError:
            return None  # removed between the listing and now

    def _image(self, ref: str) -> dict[str, Any] | None:
        try:
            return self.engine.client.api.inspect_image(ref)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as e:
            raise DockerError(f"inspect image {ref} on host {self.host}: {e.explanation or e}") from e


def _digest_for(ref: str, repo_digests: list[str]) -> str | None:
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
