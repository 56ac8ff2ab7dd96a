"""The image policy's state layer, and the policy in force: every pin, ban and wake record sparkctl
makes (the `image` commands, the pin a first `up` settles, a gate's pin or ban, a retest, the
daemon's wake ledger), and the owner's removals of lower layers' entries, kept in the state
database over the read-only files (the shipped `images.yaml`, then the owner's: `spec/imagefile.py`).

One row per entry, keyed by its canonical key: the entry as JSON, or NULL where it lifts the
entry a file holds. The deploy pipeline, the gate, the retest, the daemon and the CLI write here;
everything that decides reads `policy()`. On the first start at the schema that brought it, the
entries an older sparkctl wrote into a checkout's tracked `stacks/images.yaml` are imported once
(`_import`).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from sparkctl.policy.images import (
    DIGEST,
    SECTIONS,
    Ban,
    ImagePolicy,
    Layer,
    Layered,
    Measurement,
    Pin,
    Wake,
    canonical,
    layered,
    parse_ref,
)
from sparkctl.spec import imagefile, kept
from sparkctl.spec.imagefile import PolicyFiles
from sparkctl.state.db import Database

MODELS: dict[str, type[BaseModel]] = {"pins": Pin, "blacklist": Ban, "wakes": Wake}


class ImageRecords:
    def __init__(self, db: Database, files: PolicyFiles) -> None:
        self.db = db
        self.files = files
        if files.shipped is not None and not db.readonly:  # the writer imports (the daemon, at its start)
            self._import(files.shipped)

    def layered(self) -> Layered:
        """The policy in force, with where each entry comes from; made again only when a file or
        a record changed (`spec.kept`): the daemon asks for it on each status and park."""
        rows = tuple(tuple(r) for r in self.db.all("SELECT section, key, entry FROM image_policy ORDER BY rowid"))

        def make() -> Layered:
            return layered([*self.files.layers(), (Layer.STATE, _policy(rows))],
                           [(section, key) for section, key, entry in rows if entry is None])

        try:
            key = (self.files, kept.signature(self.files.shipped, self.files.owner), rows)
        except OSError:  # a file replaced while we looked
            return make()
        return kept.cached("image policy", key, make)

    def policy(self) -> ImagePolicy:
        return self.layered().policy

    def pin(self, ref: str, *, digest: str, provenance: str = "", known_good: bool = False) -> Pin:
        entry = Pin(digest=digest, provenance=provenance, known_good=known_good, pinned=dt.date.today())
        with self.db.tx():
            self._put("pins", parse_ref(ref).tagged, entry)
        return entry

    def unpin(self, ref: str) -> bool:
        return self._remove("pins", ref)

    def settle_pin(self, ref: str, *, digest: str) -> bool:
        """Record `digest` in `ref`'s pin if that pin has none yet (a tag known good whose digest
        was never published), as first seen, not known-good: the tag's provenance vouches for the
        build it named then, and a benchmark that passes its gate makes this digest known-good
        (`bench.stack.gate`). True if it did; a pin that names its digest, or no pin, is left."""
        with self.db.tx():
            pin = self.policy().pin_for(ref)
            if pin is None or pin.settled:
                return False
            note = f"digest recorded at first deploy on {dt.date.today().isoformat()}"
            self._put("pins", parse_ref(ref).tagged, Pin(
                digest=digest, provenance="; ".join(p for p in (pin.provenance, note) if p),
                pinned=pin.pinned, first_seen=dt.date.today()))
        return True

    def blacklist(self, ref: str, *, reason: str, date: dt.date | None = None, digest: str | None = None) -> Ban:
        """Ban `ref` (`digest`: what a banned tag names now, so a retest can tell whether it moved)."""
        entry = Ban(reason=reason, date=date or dt.date.today(), digest=digest)
        with self.db.tx():
            self._put("blacklist", canonical("blacklist", ref), entry)
        return entry

    def unblacklist(self, ref: str) -> bool:
        return self._remove("blacklist", ref)

    def record_retest(self, key: str, measurement: Measurement) -> bool:
        """Add a retest that kept the ban to the entry `key`; False if that ban is gone meanwhile."""
        key = canonical("blacklist", key)
        with self.db.tx():
            ban = self.policy().blacklist.get(key)
            if ban is None:
                return False
            self._put("blacklist", key, ban.model_copy(update={"retests": (*ban.retests, measurement)}))
        return True

    def requalify(self, *, lift: tuple[str, ...], ref: str, digest: str, provenance: str) -> Pin:
        """A retest passed: lift its bans and pin the tag to the measured digest as known-good, in
        one transaction (no reader sees the tag unbanned and unpinned)."""
        entry = Pin(digest=digest, provenance=provenance, known_good=True, pinned=dt.date.today())
        with self.db.tx():
            for key in lift:
                self._drop("blacklist", key)
            self._put("pins", parse_ref(ref).tagged, entry)
        return entry

    def record_wake(self, digest: str, *, ok: bool, reason: str = "") -> Wake:
        """How a watched wake from sleep mode went on `digest`."""
        entry = Wake(ok=ok, reason=reason, date=dt.date.today())
        with self.db.tx():
            self._put("wakes", digest, entry)
        return entry

    def forget_wake(self, digest: str) -> bool:
        return self._remove("wakes", digest)

    def _put(self, section: str, key: str, entry: BaseModel | None) -> None:
        """Record `entry` (None: lift the files' entry) under `key`; inside the caller's transaction."""
        self.db.db.execute(
            "INSERT INTO image_policy (section, key, entry, at) VALUES (?, ?, ?, ?) ON CONFLICT (section, key) "
            "DO UPDATE SET entry = excluded.entry, at = excluded.at",
            (section, key, entry.model_dump_json(exclude_defaults=True) if entry else None, time.time()))

    def _remove(self, section: str, ref: str) -> bool:
        """Remove the entries that name `ref`, however spelled: a recorded one is deleted, one a
        file holds is lifted (the file is never written). False if there was none."""
        with self.db.tx():
            return self._drop(section, ref)

    def _drop(self, section: str, ref: str) -> bool:
        keys = [key for key in getattr(self.policy(), section) if _same(key, ref)]
        below = getattr(layered(self.files.layers()).policy, section)
        for key in keys:
            if key in below:
                self._put(section, key, None)
            else:
                self.db.db.execute("DELETE FROM image_policy WHERE section = ? AND key = ?", (section, key))
        return bool(keys)

    def _import(self, path: Path) -> None:
        """Once, at the first start at this schema: the entries an older sparkctl wrote into the
        stacks dir's `images.yaml` (it edited that file in place) become records, so the file
        can go back to what sparkctl ships. Only a checkout's tracked file tells what was written:
        its entries that differ from the committed file's are recorded, and the committed file's
        entries it lacks are lifted. An installed package's file was replaced by the upgrade (what
        was written there is gone before this runs), and an owner's own stacks dir stays read as
        it is: nothing to import from either."""
        if self.db.one("SELECT 1 FROM imports WHERE what = 'images.yaml'") is None:
            return  # done before
        shipped = imagefile.committed(path)
        written = imagefile.load_policy(path) if shipped is not None else ImagePolicy()
        with self.db.tx() as db:
            if db.execute("DELETE FROM imports WHERE what = 'images.yaml'").rowcount == 0 or shipped is None:
                return  # another process did it meanwhile, or nothing tells what was written
            for section in SECTIONS:
                was, now = _canonical(shipped, section), _canonical(written, section)
                for key, entry in now.items():
                    if was.get(key) != entry:
                        self._put(section, key, entry)
                for key in was.keys() - now.keys():
                    self._put(section, key, None)


def _canonical(policy: ImagePolicy, section: str) -> dict[str, BaseModel]:
    return {canonical(section, key): entry for key, entry in getattr(policy, section).items()}


def _policy(rows: Sequence[tuple[str, str, str | None]]) -> ImagePolicy:
    """The recorded entries (not the lifts) as a policy."""
    tables: dict[str, dict[str, BaseModel]] = {section: {} for section in SECTIONS}
    for section, key, entry in rows:
        if entry is not None:
            tables[section][key] = MODELS[section].model_validate_json(entry)
    return ImagePolicy.model_validate(tables)


def _same(key: str, ref: str) -> bool:
    """Whether a policy key and a ref name the same thing, however each is spelled."""
    if DIGEST.match(key) or DIGEST.match(ref):
        return key == ref
    a, b = parse_ref(key), parse_ref(ref)
    return (a.tagged, a.digest) == (b.tagged, b.digest)
