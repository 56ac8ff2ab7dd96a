"""Compose projects through python-on-whales (docker compose v2).

A compose stack runs as a project named for its instance and stack (`sparkctl-<stack>` for the
default instance) from its directory under the compose dir, with variables from an env file
sparkctl writes (never holding the HF token) and an override file adding sparkctl's labels
(stack, instance, memory share) and engine environment and, on machines without an NVIDIA
runtime, dropping the GPU reservation; it is written by a YAML emitter, so no name or value
can add keys of its own (`privileged`, a volume). `docker compose` runs with a clean environment (PATH,
HOME and the Docker endpoint only): python-on-whales would hand it the caller's whole
environment, and a compose file's `${VAR}` could then carry a daemon's secret (its HF token)
into a container.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from python_on_whales import DockerClient
from python_on_whales.exceptions import DockerException
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.tag import Tag

from sparkctl.errors import DockerError


class ComposeProject:
    def __init__(self, project_dir: Path, *, name: str, service: str, variables: dict[str, str],
                 engine_env: dict[str, str], labels: dict[str, str], work_dir: Path, gpus: bool = True,
                 docker_host: str | None = None) -> None:
        work_dir.mkdir(parents=True, exist_ok=True)
        env_file = work_dir / "sparkctl.env"
        env_file.write_text("".join(f"{k}={v}\n" for k, v in sorted(variables.items())))  # one line each: spec checks
        override_file = work_dir / "sparkctl.override.yml"
        override_file.write_text(override(service, engine_env, labels, gpus))
        self.name, self.service = name, service
        self.client = DockerClient(compose_files=[project_dir / "compose.yml", override_file],
                                   compose_project_name=name, compose_env_files=[env_file],
                                   compose_project_directory=project_dir, client_call=clean_call(docker_host))

    def up(self) -> None:
        """Build if needed and start in the background."""
        with _translated(f"compose up {self.name}"):
            self.client.compose.up(detach=True, build=True, quiet=True)

    def down(self) -> None:
        with _translated(f"compose down {self.name}"):
            self.client.compose.down(remove_orphans=True, quiet=True)

    def binds(self) -> list[tuple[str, str, str]]:
        """(service, host path, path inside) of each bind mount the project's services would get,
        as compose reads its files and variables (`docker compose config`)."""
        with _translated(f"compose config {self.name}"):
            config = self.client.compose.config(return_json=True)
        return [(name, volume["source"], volume["target"]) for name, service in sorted(config["services"].items())
                for volume in service.get("volumes", []) if volume.get("type") == "bind"]

    def container_ids(self) -> list[str]:
        with _translated(f"compose ps {self.name}"):
            return [c.id for c in self.client.compose.ps(all=True)]


def version(docker_host: str | None = None) -> str:
    """`docker compose version`: compose v2's, or a DockerError saying it is missing."""
    with _translated("docker compose version"):
        said = DockerClient(client_call=clean_call(docker_host)).compose.version()
    return said.removeprefix("Docker Compose version ")


def clean_call(docker_host: str | None) -> list[str]:
    """`docker`, run through `env -i` with only what the Docker CLI needs."""
    keep = {name: os.environ[name] for name in ("PATH", "HOME", "DOCKER_CONFIG") if name in os.environ}
    if docker_host or os.environ.get("DOCKER_HOST"):
        keep["DOCKER_HOST"] = docker_host or os.environ["DOCKER_HOST"]
    return ["env", "-i", *(f"{name}={value}" for name, value in sorted(keep.items())), "docker"]


def override(service: str, engine_env: dict[str, str], labels: dict[str, str], gpus: bool) -> str:
    """The override file's text: `service` with sparkctl's labels and engine environment, and no
    GPU reservation unless `gpus` (compose's `!reset` tag drops the project's)."""
    settings: dict[str, Any] = {"labels": dict(sorted(labels.items()))}
    if engine_env:
        settings["environment"] = dict(sorted(engine_env.items()))
    if not gpus:
        reset = CommentedMap()
        reset.yaml_set_ctag(Tag(suffix="!reset"))
        settings["deploy"] = reset
    out = io.StringIO()
    YAML().dump({"services": {service: settings}}, out)
    return out.getvalue()


@contextmanager
def _translated(call: str) -> Iterator[None]:
    try:
        yield
    except DockerException as error:
        out = "\n".join(((error.stderr or "") + (error.stdout or "")).strip().splitlines()[-20:])
        raise DockerError(f"{call}: exit {error.return_code}: {out}") from None
