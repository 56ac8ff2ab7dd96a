"""The image policy: pins (tag -> digest, with provenance), the blacklist and the wake ledger,
and how its layers make one policy.

Pure: no I/O, no logging. `check` is asked before anything is pulled (with the ref as
written) and again once the registry has resolved the digest; `plan_retest` decides whether a
banned tag may be measured again (`sparkctl image retest`) and which bans its trial runs past.
`layered` lays the shipped `images.yaml`, the owner's and what sparkctl recorded in its state
over each other (`spec/imagefile.py` reads the files, `state/images.py` owns the records).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

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

    # None: a tag known good by its provenance whose digest nobody published (seed 003's
    # qwen36-v4); the first deploy records the digest it ran (`imagefile.settle_pin`).
    digest: str | None = Field(default=None, pattern=DIGEST.pattern)
    provenance: str = ""  # why this digest is trusted, e.g. "benchmark run 12 passed"
    known_good: bool = False
    pinned: dt.date | None = None
    # The day a first deploy recorded the digest of a pin without one: the tag's provenance vouches
    # for the build it named then, not for this digest, which is known-good once a benchmark passes.
    first_seen: dt.date | None = None

    @property
    def settled(self) -> bool:
        """Whether the pin names its digest yet."""
        return self.digest is not None


class Measurement(BaseModel):
    """One retest of a banned tag: what it named that day, and how the stack's gate judged it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    date: dt.date
    digest: str = Field(pattern=DIGEST.pattern)
    verdict: str = Field(min_length=1)  # the gate's: "fail: <why>", or the health check that stopped it
    run: int | None = None  # the benchmark run (none when the trial never became healthy)
    deployment: int | None = None  # the trial deployment


class Ban(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str = Field(min_length=1)
    date: dt.date | None = None
    digest: str | None = Field(default=None, pattern=DIGEST.pattern)  # what a banned tag named then
    retests: tuple[Measurement, ...] = ()  # later measurements that kept the ban

    def measured(self) -> set[str]:
        """The digests this ban is known to hold for: the one banned, and each one retested since."""
        return {d for d in (self.digest, *(m.digest for m in self.retests)) if d}


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

    def without(self, keys: tuple[str, ...]) -> ImagePolicy:
        """This policy with those blacklist entries lifted (a retest's trial runs past them)."""
        return self.model_copy(update={"blacklist": {k: b for k, b in self.blacklist.items() if k not in keys}})


SECTIONS = ("pins", "blacklist", "wakes")


class Layer(StrEnum):
    """Where a stack or a policy entry comes from, lowest first: the defaults sparkctl ships (read
    only), the owner's config dir (edited by hand), and what sparkctl recorded in its state."""

    SHIPPED = "shipped"
    OWNER = "owner"
    STATE = "state"


def canonical(section: str, key: str) -> str:
    """A policy key as every layer spells it: a pin by its canonical tag, a ban by its canonical
    ref (or bare digest), a wake by its digest. A key that is no ref is kept as written."""
    if section == "wakes" or DIGEST.match(key):
        return key
    try:
        name = parse_ref(key)
    except ImageRefused:
        return key
    return name.tagged if section == "pins" else str(name)


@dataclass(frozen=True)
class Layered:
    """The policy in force, where each of its entries comes from (`(section, key)` -> layer),
    and the lower layers' entries a later one replaces or lifts (-> the layer it hides)."""

    policy: ImagePolicy
    origin: Mapping[tuple[str, str], Layer]
    hidden: Mapping[tuple[str, str], Layer]

    def lifted(self) -> list[tuple[str, str, Layer]]:
        """The lower layers' entries the state removed (`image unpin` of a shipped pin, ...)."""
        return sorted(((section, key, layer) for (section, key), layer in self.hidden.items()
                       if (section, key) not in self.origin), key=lambda lift: (SECTIONS.index(lift[0]), lift[1]))


def layered(layers: Sequence[tuple[Layer, ImagePolicy]], lifted: Iterable[tuple[str, str]] = ()) -> Layered:
    """`layers` laid over each other, lowest first, keys compared canonically: an entry of a later
    layer replaces the same entry of an earlier one, and each of `lifted` removes one."""
    tables: dict[str, dict[str, BaseModel]] = {section: {} for section in SECTIONS}
    origin: dict[tuple[str, str], Layer] = {}
    hidden: dict[tuple[str, str], Layer] = {}
    for layer, policy in layers:
        for section in SECTIONS:
            for key, entry in getattr(policy, section).items():
                at = (section, canonical(section, key))
                if at in origin:
                    hidden[at] = origin[at]
                tables[section][at[1]], origin[at] = entry, layer
    for at in lifted:
        if at in origin:
            hidden[at] = origin.pop(at)
            del tables[at[0]][at[1]]
    return Layered(ImagePolicy.model_validate(tables), origin, hidden)


@dataclass(frozen=True)
class Retrial:
    """A retest that may go ahead: the banned tag, its digest now, the entry the measurement is
    recorded on, and every blacklist key the trial runs past (lifted for good if it passes)."""

    name: ImageName  # the tag, canonical
    digest: str
    key: str  # the entry a failed measurement is appended to
    lift: tuple[str, ...]


def plan_retest(policy: ImagePolicy, ref: str, digest: str, *, force: bool = False) -> Retrial:
    """Whether the tag `ref`, which names `digest` on its registry now, may be retested. A tag
    that is not banned has nothing to re-qualify; a digest banned itself, or the one the ban was
    measured on (nothing changed), is refused unless `force`."""
    name = retestable(policy, ref)
    tag_ban = next(((k, b) for k, b in policy.blacklist.items() if _bans_tag(k, name)), None)
    digest_bans = [(k, b) for k, b in policy.blacklist.items()
                   if k == digest or (not DIGEST.match(k) and parse_ref(k).digest == digest)]
    if tag_ban is None and not digest_bans:
        raise _not_banned(name)
    if not force:
        _refuse_unchanged(name, digest, tag_ban, digest_bans)
    bans = ([tag_ban] if tag_ban else []) + digest_bans
    return Retrial(name, digest, bans[0][0], tuple(k for k, _ in bans))


def retestable(policy: ImagePolicy, ref: str) -> ImageName:
    """`ref` as a tag a retest may resolve: refused before any registry is asked when neither
    the tag nor any digest is blacklisted (the digest it names could not be either)."""
    name = retest_tag(ref)
    if not any(_bans_tag(k, name) or _is_digest_ban(k) for k in policy.blacklist):
        raise _not_banned(name)
    return name


def _not_banned(name: ImageName) -> ImageRefused:
    return ImageRefused(f"{name.tagged} is not blacklisted: there is nothing to re-qualify "
                        "(`sparkctl image list` shows the blacklist)")


def retest_tag(ref: str) -> ImageName:
    """`ref` as the tag a retest resolves again; a digest or an untagged ref is refused."""
    name = parse_ref(ref)
    if name.digest or not name.tag:
        raise ImageRefused(f"retest takes a tag (repo:tag), got {ref}: a digest never changes, so measuring it "
                           "again tells nothing new; `sparkctl image unblacklist` lifts a ban by hand")
    return name


def _refuse_unchanged(name: ImageName, digest: str, tag_ban: tuple[str, Ban] | None,
                      digest_bans: list[tuple[str, Ban]]) -> None:
    again = "; `--force` measures it anyway"
    if digest_bans:
        key, ban = digest_bans[0]
        raise ImageRefused(f"{name.tagged} names {digest} on its registry now, and that digest is blacklisted "
                           f"itself ({key}: {ban.reason}){again}")
    assert tag_ban is not None
    key, ban = tag_ban
    if digest in ban.measured():
        since = f" since {ban.date.isoformat()}" if ban.date else ""
        raise ImageRefused(f"{name.tagged} still names {digest}, the digest its ban ({ban.reason}) was measured "
                           f"on{since}: nothing changed, so a retest would measure the same image{again}")


def _bans_tag(key: str, name: ImageName) -> bool:
    if DIGEST.match(key):
        return False
    banned = parse_ref(key)
    return not banned.digest and banned.tagged == name.tagged


def _is_digest_ban(key: str) -> bool:
    return bool(DIGEST.match(key)) or parse_ref(key).digest is not None


def check(policy: ImagePolicy, ref: str, *, digest: str | None = None, allow_latest: bool = False) -> ImageName:
    """Refuse a blacklisted ref or digest, or a moving `latest`/untagged ref without opt-in."""
    name = parse_ref(ref)
    found = policy.ban_for(ref, digest)
    if found:
        key, ban = found
        since = f" since {ban.date.isoformat()}" if ban.date else ""
        retest = name.tag and not name.digest and not _is_digest_ban(key)  # a tag may name a fixed image now
        hint = (f"`sparkctl image retest {name.tagged}` measures what the tag names now and lifts the ban if it "
                "passes the stack's gate" if retest else f"`sparkctl image unblacklist {key}` if it is fixed")
        raise ImageRefused(f"image {ref} is blacklisted{since}: {ban.reason}. Use a known-good tag, or {hint}.")
    moving = name.tag in (None, "latest") and not name.digest
    if moving and not allow_latest:
        raise ImageRefused(
            f"image {ref} names a moving tag ({name.tag or 'untagged'}); pin a versioned tag or a "
            "digest, or set `image.allow_latest: true` in the stack to accept it"
        )
    return name
