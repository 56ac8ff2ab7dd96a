"""The image policy: pins (tag -> digest, with provenance) and the blacklist.

Pure: no I/O, no logging. `check` is asked before anything is pulled (with the ref as
written) and again once the registry has resolved the digest. `spec/imagefile.py` reads and
edits the YAML file this is built from.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from sparkctl.errors import ImageRefused

DEFAULT_REGISTRY = "docker.io"
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_COMPONENT = r"[a-z0-9]+(?:[._-]+[a-z0-9]+)*"
_REF = re.compile(
    rf"^(?:(?P<host>[a-z0-9.-]+(?::\d+)?)/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>\w[\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)


@dataclass(frozen=True)
class ImageName:
    """A parsed image ref, with Docker Hub's implicit registry and `library/` made explicit."""

    registry: str
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def repository(self) -> str:
        return f"{self.registry}/{self.path}"

    @property
    def tagged(self) -> str:
        """`registry/path:tag` (canonical), or the repository alone when untagged."""
        return f"{self.repository}:{self.tag}" if self.tag else self.repository

    def __str__(self) -> str:
        return self.tagged + (f"@{self.digest}" if self.digest else "")


def parse_ref(ref: str) -> ImageName:
    """Parse `[registry/]path[:tag][@sha256:...]`; raise ImageRefused on nonsense."""
    match = _REF.match(ref.strip())
    if not match:
        raise ImageRefused(f"{ref!r} is not an image reference (expected [registry/]name[:tag][@sha256:<64 hex>])")
    host, path = match["host"], match["path"]
    if host and not ("." in host or ":" in host or host == "localhost"):
        host, path = None, f"{host}/{path}"  # `vllm/vllm-openai`: a Docker Hub namespace
    registry = host or DEFAULT_REGISTRY
    if registry == DEFAULT_REGISTRY and "/" not in path:
        path = f"library/{path}"
    tag, digest = match["tag"], match["digest"]
    return ImageName(registry, path, tag, digest)


def mirrored(name: ImageName, mirrors: Mapping[str, str]) -> str:
    """The ref to fetch: `name` with its registry swapped for a configured mirror, if any."""
    mirror = mirrors.get(name.registry)
    if not mirror:
        return str(name)
    return str(ImageName(mirror, name.path, name.tag, name.digest))


class Pin(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    digest: str = Field(pattern=DIGEST.pattern)
    provenance: str = ""  # why this digest is trusted, e.g. "benchmark run 12 passed"
    known_good: bool = False
    pinned: dt.date | None = None


class Ban(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str = Field(min_length=1)
    date: dt.date | None = None


class Wake(BaseModel):
    """How the first watched wake from sleep mode went on a digest (a failed one parks with stop)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    reason: str = ""
    date: dt.date | None = None


class ImagePolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    pins: dict[str, Pin] = {}
    blacklist: dict[str, Ban] = {}
    wakes: dict[str, Wake] = {}  # image digest -> its wake record

    def wake_refused(self, digest: str | None) -> str | None:
        """Why stacks on this digest must not sleep, if a wake on it failed."""
        wake = self.wakes.get(digest or "")
        if wake is None or wake.ok:
            return None
        since = f", recorded {wake.date.isoformat()}" if wake.date else ""
        return (f"image {digest} cannot sleep and wake ({wake.reason}{since}); "
                f"`sparkctl image forget-wake {digest}` lets it try again")

    def pin_for(self, ref: str) -> Pin | None:
        """The pin of `ref`'s tag, however the ref is spelled."""
        tagged = parse_ref(ref).tagged
        return next((pin for key, pin in self.pins.items() if parse_ref(key).tagged == tagged), None)

    def ban_for(self, ref: str, digest: str | None = None) -> tuple[str, Ban] | None:
        """The blacklist entry that matches `ref` (as tagged) or its digest, if any."""
        name = parse_ref(ref)
        digests = {d for d in (name.digest, digest) if d}
        for key, ban in self.blacklist.items():
            if key in digests:
                return key, ban
            if DIGEST.match(key):
                continue
            banned = parse_ref(key)
            if banned.digest and banned.digest in digests:
                return key, ban
            if not banned.digest and banned.tagged == name.tagged:
                return key, ban
        return None


def check(policy: ImagePolicy, ref: str, *, digest: str | None = None, allow_latest: bool = False) -> ImageName:
    """Refuse a blacklisted ref or digest, or a moving `latest`/untagged ref without opt-in."""
    name = parse_ref(ref)
    found = policy.ban_for(ref, digest)
    if found:
        key, ban = found
        since = f" since {ban.date.isoformat()}" if ban.date else ""
        raise ImageRefused(
            f"image {ref} is blacklisted{since}: {ban.reason}. "
            f"Use a known-good tag, or `sparkctl image unblacklist {key}` if it is fixed."
        )
    moving = name.tag in (None, "latest") and not name.digest
    if moving and not allow_latest:
        raise ImageRefused(
            f"image {ref} names a moving tag ({name.tag or 'untagged'}); pin a versioned tag or a "
            "digest, or set `image.allow_latest: true` in the stack to accept it"
        )
    return name
