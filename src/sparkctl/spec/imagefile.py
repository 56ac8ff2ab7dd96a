"""Read and edit `images.yaml` (pins, blacklist with its retest measurements, wake records),
keeping its comments and order.

The daemon is the one that edits it (`sparkctl image ...` ask it: `daemon/actions/images.py`;
the deploy pipeline, the gate and the retest run in it); the CLI only reads it. The decisions
themselves live in `policy/images.py`.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from sparkctl.errors import SpecError
from sparkctl.policy.images import DIGEST, Ban, ImagePolicy, Measurement, Pin, Wake, parse_ref
from sparkctl.settings import Settings
from sparkctl.spec import kept, yamlfile

if TYPE_CHECKING:
    from ruamel.yaml.comments import CommentedMap


def policy_for(settings: Settings) -> ImagePolicy:
    """The image policy in the stacks dir, read again only when images.yaml changed (`spec.kept`)."""
    path = settings.images_file
    try:
        key = kept.signature(path)
    except OSError:  # replaced while we looked
        return load_policy(path)
    return kept.cached("policy", (path, key), lambda: load_policy(path))


def load_policy(path: Path) -> ImagePolicy:
    """The policy in `path`; an absent file is an empty policy."""
    if not path.exists():
        return ImagePolicy()
    data = yamlfile.read(path) or {}
    try:
        return ImagePolicy.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise SpecError(str(path), key, f"{first['msg']} (allowed top-level keys: pins, blacklist, wakes)") from None


def pin(path: Path, ref: str, *, digest: str, provenance: str = "", known_good: bool = False) -> Pin:
    entry = Pin(digest=digest, provenance=provenance, known_good=known_good, pinned=dt.date.today())
    _edit(path, "pins", parse_ref(ref).tagged, entry.model_dump(exclude_defaults=True))
    return entry


def unpin(path: Path, ref: str) -> bool:
    return _remove(path, "pins", ref)


def settle_pin(path: Path, ref: str, *, digest: str) -> bool:
    """Record `digest` in `ref`'s pin if that pin has none yet (a tag known good whose digest
    was never published), as first seen, not known-good: the tag's provenance vouches for the
    build it named then, and a benchmark that passes its gate makes this digest known-good
    (`bench.stack.gate`). True if it did; a pin that names its digest, or no pin, is left."""
    settled: list[str] = []

    def apply(doc: CommentedMap) -> None:
        table = doc.get("pins") or {}
        for key, entry in table.items():
            if _same(key, ref) and entry is not None and not entry.get("digest"):
                note = f"digest recorded at first deploy on {dt.date.today().isoformat()}"
                entry.insert(0, "digest", digest)
                entry.pop("known_good", None)
                entry["first_seen"] = dt.date.today()
                entry["provenance"] = "; ".join(p for p in (entry.get("provenance"), note) if p)
                settled.append(key)

    _round_trip(path, apply)
    return bool(settled)


def blacklist(path: Path, ref: str, *, reason: str, date: dt.date | None = None, digest: str | None = None) -> Ban:
    """Ban `ref` (`digest`: what a banned tag names now, so a retest can tell whether it moved)."""
    entry = Ban(reason=reason, date=date or dt.date.today(), digest=digest)
    key = ref if DIGEST.match(ref) else str(parse_ref(ref))
    _edit(path, "blacklist", key, entry.model_dump(exclude_defaults=True))
    return entry


def unblacklist(path: Path, ref: str) -> bool:
    return _remove(path, "blacklist", ref)


def record_retest(path: Path, key: str, measurement: Measurement) -> bool:
    """Append a retest that kept the ban to the entry `key`; False if that ban is gone meanwhile."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    found: list[bool] = []

    def apply(doc: CommentedMap) -> None:
        entry = (doc.get("blacklist") or {}).get(key)
        found.append(entry is not None)
        if entry is not None:
            if entry.get("retests") is None:
                entry["retests"] = CommentedSeq()
            entry["retests"].append(CommentedMap(measurement.model_dump(exclude_none=True)))

    _round_trip(path, apply)
    return found[0]


def requalify(path: Path, *, lift: tuple[str, ...], ref: str, digest: str, provenance: str) -> Pin:
    """A retest passed: lift its bans and pin the tag to the measured digest as known-good, in
    one edit (no reader sees the tag unbanned and unpinned)."""
    from ruamel.yaml.comments import CommentedMap

    entry = Pin(digest=digest, provenance=provenance, known_good=True, pinned=dt.date.today())

    def apply(doc: CommentedMap) -> None:
        bans = doc.get("blacklist") or {}
        for key in [k for k in bans if k in lift]:
            del bans[key]
        if doc.get("pins") is None:
            doc["pins"] = CommentedMap()
        doc["pins"][parse_ref(ref).tagged] = CommentedMap(entry.model_dump(exclude_defaults=True))

    _round_trip(path, apply)
    return entry


def record_wake(path: Path, digest: str, *, ok: bool, reason: str = "") -> Wake:
    """How a watched wake from sleep mode went on `digest`."""
    entry = Wake(ok=ok, reason=reason, date=dt.date.today())
    _edit(path, "wakes", digest, entry.model_dump(exclude_defaults=True) | {"ok": ok})
    return entry


def forget_wake(path: Path, digest: str) -> bool:
    return _remove(path, "wakes", digest)


def _edit(path: Path, section: str, key: str, value: dict[str, Any]) -> None:
    from ruamel.yaml.comments import CommentedMap  # ruamel only when the file is edited

    def apply(doc: CommentedMap) -> None:
        table = doc.setdefault(section, CommentedMap())
        if table is None:
            table = doc[section] = CommentedMap()
        table[key] = CommentedMap(value)

    _round_trip(path, apply)


def _remove(path: Path, section: str, ref: str) -> bool:
    removed: list[str] = []

    def apply(doc: CommentedMap) -> None:
        table = doc.get(section) or {}
        removed.extend(key for key in table if _same(key, ref))
        for key in removed:
            del table[key]

    _round_trip(path, apply)
    return bool(removed)


def _same(key: str, ref: str) -> bool:
    """Whether a policy key and a ref name the same thing, however each is spelled."""
    if DIGEST.match(key) or DIGEST.match(ref):
        return key == ref
    a, b = parse_ref(key), parse_ref(ref)
    return (a.tagged, a.digest) == (b.tagged, b.digest)


def _round_trip(path: Path, apply: Callable[[CommentedMap], None]) -> None:
    """Load with comments, apply, validate the result, and replace the file atomically; one
    writer at a time (a daemon's threads, and the daemons of instances that share the stacks
dir), so no edit is lost."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    with open(path.with_suffix(".yaml.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        doc = yamlfile.read_commented(path, yaml)
        doc = doc if isinstance(doc, CommentedMap) else CommentedMap()
        apply(doc)
        tmp = path.with_suffix(".yaml.tmp")
        with tmp.open("w", encoding="utf-8") as out:
            yaml.dump(doc, out)
        try:
            load_policy(tmp)
        except SpecError:
            tmp.unlink()
            raise
        os.replace(tmp, path)
