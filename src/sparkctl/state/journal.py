"""What happened beside deployments: events of running stacks (a crash, a restart, an
adoption), alias switches with their outcome and timings, and what each image tag or model
revision resolved to (so later `up`s run exactly that), and what a registry last answered for a
pinned tag."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from sparkctl.state.db import Database, where


class Events:
    def __init__(self, db: Database) -> None:
        self.db = db

    def record(self, stack: str, kind: str, detail: str = "") -> None:
        """Something that happened to a running stack (a crash, a restart) outside any deploy."""
        with self.db.tx() as db:
            db.execute("INSERT INTO events VALUES (?, ?, ?, ?)", (time.time(), stack, kind, detail))

    def list(self, stack: str | None = None, *, limit: int = 100) -> list[dict[str, object]]:
        clause, args = where(stack, limit)
        return [dict(r) for r in self.db.all("SELECT at, stack, kind, detail FROM events" + clause, args)]


class Switches:
    def __init__(self, db: Database) -> None:
        self.db = db

    def begin(self, record: dict[str, object]) -> int:
        """A switch of an alias starts: from, to, mode; finished later with its outcome and timings."""
        with self.db.tx() as db:
            cur = db.execute("INSERT INTO switches (at, alias, record) VALUES (?, ?, ?)",
                             (time.time(), record["alias"], json.dumps(record, sort_keys=True)))
        return cur.lastrowid

    def finish(self, switch: int, record: dict[str, object]) -> None:
        with self.db.tx() as db:
            db.execute("UPDATE switches SET record = ?, finished = ? WHERE id = ?",
                       (json.dumps(record, sort_keys=True), time.time(), switch))

    def list(self, *, unfinished: bool = False, limit: int = 50) -> list[dict]:
        query = "SELECT id, at, record FROM switches" + (" WHERE finished IS NULL" if unfinished else "") + \
            " ORDER BY id DESC LIMIT ?"
        return [{"id": r["id"], "at": r["at"], **json.loads(r["record"])} for r in self.db.all(query, (limit,))]


class Digests:
    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, ref: str) -> str | None:
        """What `ref` (an image tag, or `hf:repo@revision`) resolved to when last fetched."""
        row = self.db.one("SELECT digest FROM digests WHERE ref = ?", (ref,))
        return row["digest"] if row else None

    def newest(self) -> float:
        """When any tag or revision was last resolved: a later pin or `--refresh` moves it."""
        return self.db.one("SELECT COALESCE(MAX(resolved), 0) FROM digests")[0]

    def record(self, ref: str, digest: str) -> None:
        with self.db.tx() as db:
            db.execute("INSERT INTO digests VALUES (?, ?, ?) ON CONFLICT (ref) DO UPDATE SET "
                       "digest = excluded.digest, resolved = excluded.resolved", (ref, digest, time.time()))


class Answers:
    """The digest a registry served for a pinned tag, and when it was asked (not a pin: an `up`
    of a pinned tag only says whether the tag moved). An answer is taken as still true for
    `KEPT_S`: a repeated `up` is not held up by a registry on the internet, and a tag that moves
    is noticed within a minute."""

    KEPT_S = 60

    def __init__(self, db: Database) -> None:
        self.db = db

    def ask(self, ref: str, asker: Callable[[str], str | None]) -> str | None:
        """What the registry serves for `ref`: its answer of the last KEPT_S, else `asker`'s
        (kept; None: it got none)."""
        row = self.db.one("SELECT digest FROM answers WHERE ref = ? AND asked > ?", (ref, time.time() - self.KEPT_S))
        if row is not None:
            return row["digest"]
        if (digest := asker(ref)) is not None:
            self.record(ref, digest)
        return digest

    def record(self, ref: str, digest: str, *, now: float | None = None) -> None:
        with self.db.tx() as db:
            db.execute("INSERT INTO answers VALUES (?, ?, ?) ON CONFLICT (ref) DO UPDATE SET "
                       "digest = excluded.digest, asked = excluded.asked", (ref, digest, now or time.time()))
