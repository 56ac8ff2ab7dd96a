"""Two reads of Docker's API without the Docker SDK: a named container's labels if it runs, and
the digest a registry serves for a tag.

The CLI's unchanged `up` (`deploy/quick.py`) asks only these, and importing the SDK (requests,
urllib3) would cost it more than everything else it does (docs/perf.md). Everything else goes
through `DockerEngine`."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

from sparkctl.unixhttp import UnixHTTP

DEFAULT_HOST = "unix:///var/run/docker.sock"


def socket_of(docker_host: str | None, environ: Mapping[str, str] = os.environ) -> Path | None:
    """The unix socket the SDK connects to for `docker_host` (else DOCKER_HOST, else the default),
    None for a TCP or SSH engine."""
    host = docker_host or environ.get("DOCKER_HOST") or DEFAULT_HOST
    return Path(host.removeprefix("unix://")) if host.startswith("unix://") else None


def running_labels(socket: Path, name: str, *, timeout: float = 5) -> dict[str, str] | None:
    """The labels of container `name` while it runs; None if it is missing or not running.
    Raises OSError when Docker cannot be asked."""
    found = _get(socket, f"/containers/{quote(name, safe='')}/json", timeout)
    return dict(found["Config"].get("Labels") or {}) if found and found["State"].get("Running") else None


def registry_digest(socket: Path, ref: str, *, timeout: float = 30) -> str | None:
    """The manifest digest the registry serves for `ref` now, as Docker asks it (the SDK's
    `get_registry_data`, without credentials); None if the registry did not answer it."""
    found = _get(socket, f"/distribution/{quote(ref, safe='/:@')}/json", timeout)
    return found["Descriptor"]["digest"] if found else None


def _get(socket: Path, target: str, timeout: float) -> dict | None:
    try:
        with UnixHTTP(socket, timeout).request("GET", target) as response:
            status, body = response.status, response.read()
    except OSError as e:
        raise OSError(f"Docker at {socket}: {e}") from e
    return json.loads(body) if status == 200 else None
