"""A registry's manifests over its HTTP API (the OCI distribution spec), for what Docker's own API
does not say before a pull: how many bytes an image's layers are. `sparkctl doctor` and `up`'s
disk check size a pull with it.

An index (a multi-platform image) is followed to the manifest of this machine's platform. A
registry that asks for a bearer token (ghcr.io, nvcr.io, Docker Hub) gets an anonymous one from
the realm it names; a private registry's credentials stay with Docker, so such an image is
sized only once Docker has pulled it. A loopback registry is spoken to over plain HTTP, as
Docker does; every other over HTTPS.
"""

from __future__ import annotations

import json
import platform
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from sparkctl.errors import SparkctlError, Unreachable, unreachable_problem
from sparkctl.policy.images import DEFAULT_REGISTRY, mirrored, parse_ref

TIMEOUT = 10.0  # s for each request
ACCEPT = ", ".join([
    "application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json"])
ARCH = {"aarch64": "arm64", "arm64": "arm64", "x86_64": "amd64", "amd64": "amd64"}
CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


def image_bytes(ref: str, *, mirrors: Mapping[str, str] = {}, arch: str | None = None) -> int:
    """The compressed bytes of `ref`'s config and layers for this machine's platform (or `arch`),
    as its registry (or mirror) lists them now."""
    name = parse_ref(mirrored(parse_ref(ref), mirrors))
    host = "registry-1.docker.io" if name.registry == DEFAULT_REGISTRY else name.registry
    base = f"{'http' if _loopback(host) else 'https'}://{host}/v2/{name.path}/manifests/"
    manifest = _get(base + (name.digest or name.tag or "latest"), ref)
    if "manifests" in manifest:
        wanted = arch or ARCH.get(platform.machine(), platform.machine())
        entry = next((m for m in manifest["manifests"] if m.get("platform", {}).get("os") == "linux"
                      and m.get("platform", {}).get("architecture") == wanted), None)
        if entry is None:
            raise SparkctlError(f"image {ref} has no linux/{wanted} build: pick a tag built for this machine")
        manifest = _get(base + entry["digest"], ref)
    return int(manifest["config"]["size"]) + sum(int(layer["size"]) for layer in manifest["layers"])


def _get(url: str, ref: str, token: str | None = None) -> dict[str, Any]:
    headers = {"Accept": ACCEPT} | ({"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as e:
        challenge = e.headers.get("WWW-Authenticate", "")
        if e.code == 401 and token is None and challenge.lower().startswith("bearer"):
            return _get(url, ref, _anonymous_token(dict(CHALLENGE.findall(challenge)), ref))
        raise SparkctlError(f"read the manifest of {ref}: its registry said {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise Unreachable(f"read the manifest of {ref}", host=urlsplit(url).netloc,
                          problem=unreachable_problem(getattr(e, "reason", e)),
                          setting="SPARKCTL_REGISTRY_MIRRORS") from None
    except ValueError as e:
        raise SparkctlError(f"read the manifest of {ref}: its registry's answer is not JSON ({e})") from None


def _anonymous_token(challenge: dict[str, str], ref: str) -> str:
    query = urllib.parse.urlencode({k: v for k, v in challenge.items() if k in ("service", "scope")})
    try:
        with urllib.request.urlopen(f"{challenge['realm']}?{query}", timeout=TIMEOUT) as answer:
            body = json.loads(answer.read())
    except (KeyError, urllib.error.URLError, OSError, ValueError) as e:
        raise SparkctlError(f"read the manifest of {ref}: its registry gave no anonymous token ({e}); a private "
                            "image is sized once Docker pulled it") from None
    return body.get("token") or body["access_token"]


def _loopback(host: str) -> bool:
    name = re.sub(r":\d+$", "", host).strip("[]")
    return name in ("localhost", "::1") or name.startswith("127.")
