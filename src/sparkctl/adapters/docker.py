"""The Docker engine, through the `docker` SDK: containers from plans, found by labels.

Every SDK exception is translated into a `DockerError` naming the call, the HTTP status and
the engine's explanation. Built once by the CLI or the daemon from settings.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import docker
import docker.errors
from docker.types import DeviceRequest, Mount

from sparkctl.errors import DockerError
from sparkctl.policy.images import mirrored, parse_ref
from sparkctl.spec.render import LABEL_STACK, ContainerPlan


class DockerEngine:
    def __init__(self, base_url: str | None = None, *, timeout: int = 120) -> None:
        with _translated("connect to the Docker engine"):
            self.client = docker.DockerClient(base_url=base_url, timeout=timeout) if base_url \
                else docker.from_env(timeout=timeout)

    def create(self, plan: ContainerPlan, *, labels: dict[str, str] | None = None) -> str:
        """Create (not start) the planned container; returns its id."""
        with _translated(f"create container {plan.name} from {plan.image}"):
            container = self.client.containers.create(
                plan.image,
                command=list(plan.command),
                entrypoint=list(plan.entrypoint) if plan.entrypoint else None,
                name=plan.name,
                environment=dict(plan.env),
                labels={**plan.labels, **(labels or {})},
                network_mode=plan.network_mode,
                ipc_mode=plan.ipc_mode,
                shm_size=plan.shm_size,
                mounts=[Mount(m.target, m.source, type="bind", read_only=m.read_only) for m in plan.mounts],
                device_requests=_gpus(plan.gpus),
            )
        return container.id

    def registry_digest(self, ref: str, *, mirrors: Mapping[str, str] = {}) -> str:
        """The manifest digest the registry (or its mirror) serves for `ref` now."""
        source = mirrored(parse_ref(ref), mirrors)
        with _translated(f"resolve {source} at its registry"):
            return self.client.images.get_registry_data(source).id

    def inspect(self, name_or_id: str) -> dict[str, Any]:
        with _translated(f"inspect container {name_or_id}"):
            return self.client.api.inspect_container(name_or_id)

    def remove(self, name_or_id: str) -> bool:
        """Remove a container (running or not); False if there was none."""
        try:
            with _translated(f"remove container {name_or_id}"):
                self.client.api.remove_container(name_or_id, force=True, v=True)
        except DockerError as e:
            if "No such container" in str(e):
                return False
            raise
        return True

    def containers(self, **labels: str) -> list[dict[str, Any]]:
        """Containers (any state) carrying sparkctl's stack label and all given labels."""
        wanted = [LABEL_STACK] + [f"{k}={v}" for k, v in labels.items()]
        with _translated("list containers"):
            return self.client.api.containers(all=True, filters={"label": wanted})


def _gpus(gpus: str | int) -> list[DeviceRequest]:
    if gpus == "none":
        return []
    count = -1 if gpus == "all" else int(gpus)
    return [DeviceRequest(count=count, capabilities=[["gpu"]])]


@contextmanager
def _translated(call: str) -> Iterator[None]:
    try:
        yield
    except docker.errors.APIError as e:
        status = getattr(e.response, "status_code", "?")
        raise DockerError(f"{call}: Docker said {status}: {e.explanation or e}") from e
    except docker.errors.DockerException as e:
        raise DockerError(
            f"{call}: {e}. Is dockerd running and is DOCKER_HOST / SPARKCTL_DOCKER_HOST right?"
        ) from e
