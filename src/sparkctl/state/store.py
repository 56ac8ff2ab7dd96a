"""The state store: SQLite in the state dir (WAL), with numbered schema migrations.

Holds deployments (fingerprint parts, outcome, error), their phase transitions with times,
what each image tag and model revision resolved to (digest, commit), so later `up`s run
exactly that, events of running stacks, alias switches with their timings, and benchmark runs
(rows per depth, the gate's verdict, each stack's last known-good run). The deploy
pipeline and the daemon write it; `status` reads it. Opened per process; every write is its own short transaction.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sparkctl.errors import SparkctlError, TransientError
from sparkctl.phase import Phase

# The columns each row type is read with, named: a migration that adds a column changes nothing here.
DEPLOYMENT = "id, stack, fingerprint, parts, phase, started, finished, error"
BENCH_RUN = "id, stack, fingerprint, parts, profile, folder, started, finished, error, verdict"

MIGRATIONS = (
    """
    CREATE TABLE deployments (
        id INTEGER PRIMARY KEY,
        stack TEXT NOT NULL,
        fingerprint TEXT,
        parts TEXT NOT NULL DEFAULT '{}',
        phase TEXT NOT NULL,
        started REAL NOT NULL,
        finished REAL,
        error TEXT
    );
    CREATE INDEX deployments_stack ON deployments (stack, id);
    CREATE TABLE transitions (
        deployment INTEGER NOT NULL REFERENCES deployments (id),
        phase TEXT NOT NULL,
        at REAL NOT NULL,
        detail TEXT NOT NULL DEFAULT ''
    );
    CREATE TABLE digests (
        ref TEXT PRIMARY KEY,
        digest TEXT NOT NULL,
        resolved REAL NOT NULL
    );
    """,
    """
    CREATE TABLE events (
        at REAL NOT NULL,
        stack TEXT NOT NULL,
        kind TEXT NOT NULL,
        detail TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX events_stack ON events (stack, at);
    """,
    """
    CREATE TABLE switches (
        id INTEGER PRIMARY KEY,
        at REAL NOT NULL,
        alias TEXT NOT NULL,
        record TEXT NOT NULL,
        finished REAL
    );
    """,
    """
    CREATE TABLE bench_runs (
        id INTEGER PRIMARY KEY,
        stack TEXT NOT NULL,
        fingerprint TEXT,
        parts TEXT NOT NULL DEFAULT '{}',
        profile TEXT NOT NULL,
        folder TEXT NOT NULL DEFAULT '',
        started REAL NOT NULL,
        finished REAL,
        error TEXT,
        verdict TEXT
    );
    CREATE TABLE bench_rows (
        run INTEGER NOT NULL REFERENCES bench_runs (id),
        row TEXT NOT NULL
    );
    CREATE TABLE known_good (
        stack TEXT PRIMARY KEY,
        run INTEGER NOT NULL REFERENCES bench_runs (id),
        image TEXT NOT NULL,
        at REAL NOT NULL
    );
    """,
)


@dataclass(frozen=True)
class Deployment:
    id: int
    stack: str
    fingerprint: str | None
    parts: dict[str, str]
    phase: Phase
    started: float
    finished: float | None
    error: str | None


@dataclass(frozen=True)
class BenchRun:
    id: int
    stack: str
    fingerprint: str | None
    parts: dict[str, str]  # the deployment's image digest, model and draft commits, patch-set hash
    profile: str
    folder: str
    started: float
    finished: float | None
    error: str | None
    verdict: str | None  # the gate's: "pass" or "fail: <why>"
    rows: list[dict]


class Store:
    def __init__(self, path: Path, *, timeout: float = 30) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600, exist_ok=True)
        path.chmod(0o600)  # private (older versions made it 0644): it names stacks, digests and history
        # The daemon shares one store between its threads: one connection, one lock.
        self.db = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
        self.lock = threading.RLock()
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as e:
            raise SparkctlError(f"{path}: the state database is unreadable ({e}); move it aside and sparkctl "
                                "starts a new one (deployment and benchmark history are then lost)") from None

    def close(self) -> None:
        self.db.close()

    def begin(self, stack: str) -> int:
        now = time.time()
        with self._tx():
            cur = self.db.execute("INSERT INTO deployments (stack, phase, started) VALUES (?, ?, ?)",
                                  (stack, Phase.RESOLVING, now))
            self.db.execute("INSERT INTO transitions VALUES (?, ?, ?, '')", (cur.lastrowid, Phase.RESOLVING, now))
        return cur.lastrowid

    def advance(self, deployment: int, phase: Phase, detail: str = "", *, error: str | None = None) -> None:
        now = time.time()
        finished = now if phase.is_terminal() else None
        with self._tx():
            self.db.execute("UPDATE deployments SET phase = ?, finished = ?, error = COALESCE(?, error) WHERE id = ?",
                            (phase, finished, error, deployment))
            self.db.execute("INSERT INTO transitions VALUES (?, ?, ?, ?)", (deployment, phase, now, detail))

    def set_fingerprint(self, deployment: int, fingerprint: str, parts: dict[str, str]) -> None:
        with self._tx():
            self.db.execute("UPDATE deployments SET fingerprint = ?, parts = ? WHERE id = ?",
                            (fingerprint, json.dumps(parts, sort_keys=True), deployment))

    def latest(self, stack: str) -> Deployment | None:
        row = self._one(f"SELECT {DEPLOYMENT} FROM deployments WHERE stack = ? ORDER BY id DESC LIMIT 1", (stack,))
        return _deployment(row) if row else None

    def history(self, stack: str | None = None, *, limit: int = 50) -> list[Deployment]:
        query = f"SELECT {DEPLOYMENT} FROM deployments" + (" WHERE stack = ?" if stack else "") + \
            " ORDER BY id DESC LIMIT ?"
        return [_deployment(r) for r in self._all(query, (stack, limit) if stack else (limit,))]

    def healthy_fingerprints(self, stack: str) -> set[str]:
        """Fingerprints of the stack's deployments that passed every health phase."""
        rows = self._all("SELECT DISTINCT d.fingerprint FROM deployments d JOIN transitions t ON t.deployment = d.id "
                         "WHERE d.stack = ? AND t.phase = ? AND d.fingerprint IS NOT NULL", (stack, Phase.RUNNING))
        return {r[0] for r in rows}

    def transitions(self, deployment: int) -> list[tuple[Phase, float, str]]:
        rows = self._all("SELECT phase, at, detail FROM transitions WHERE deployment = ? ORDER BY rowid",
                         (deployment,))
        return [(Phase(p), at, d) for p, at, d in rows]

    def resolved(self, ref: str) -> str | None:
        """What `ref` (an image tag, or `hf:repo@revision`) resolved to when last fetched."""
        row = self._one("SELECT digest FROM digests WHERE ref = ?", (ref,))
        return row[0] if row else None

    def record_resolved(self, ref: str, digest: str) -> None:
        with self._tx():
            self.db.execute("INSERT INTO digests VALUES (?, ?, ?) ON CONFLICT (ref) DO UPDATE SET "
                            "digest = excluded.digest, resolved = excluded.resolved", (ref, digest, time.time()))

    def record_event(self, stack: str, kind: str, detail: str = "") -> None:
        """Something that happened to a running stack (a crash, a restart) outside any deploy."""
        with self._tx():
            self.db.execute("INSERT INTO events VALUES (?, ?, ?, ?)", (time.time(), stack, kind, detail))

    def events(self, stack: str | None = None, *, limit: int = 100) -> list[dict[str, object]]:
        query = "SELECT at, stack, kind, detail FROM events" + (" WHERE stack = ?" if stack else "") + \
            " ORDER BY rowid DESC LIMIT ?"
        rows = self._all(query, (stack, limit) if stack else (limit,))
        return [{"at": at, "stack": s, "kind": k, "detail": d} for at, s, k, d in rows]

    def begin_switch(self, record: dict[str, object]) -> int:
        """A switch of an alias starts: from, to, mode; finished later with its outcome and timings."""
        with self._tx():
            cur = self.db.execute("INSERT INTO switches (at, alias, record) VALUES (?, ?, ?)",
                                  (time.time(), record["alias"], json.dumps(record, sort_keys=True)))
        return cur.lastrowid

    def finish_switch(self, switch: int, record: dict[str, object]) -> None:
        with self._tx():
            self.db.execute("UPDATE switches SET record = ?, finished = ? WHERE id = ?",
                            (json.dumps(record, sort_keys=True), time.time(), switch))

    def switches(self, *, unfinished: bool = False, limit: int = 50) -> list[dict]:
        query = "SELECT id, at, record FROM switches" + (" WHERE finished IS NULL" if unfinished else "") + \
            " ORDER BY id DESC LIMIT ?"
        return [{"id": i, "at": at, **json.loads(r)} for i, at, r in self._all(query, (limit,))]

    def begin_bench(self, stack: str, fingerprint: str | None, parts: dict[str, str], profile: str) -> int:
        with self._tx():
            cur = self.db.execute("INSERT INTO bench_runs (stack, fingerprint, parts, profile, started) "
                                  "VALUES (?, ?, ?, ?, ?)", (stack, fingerprint, json.dumps(parts, sort_keys=True),
                                                             profile, time.time()))
        return cur.lastrowid

    def finish_bench(self, run: int, *, folder: str, rows: list[dict], error: str | None = None) -> None:
        with self._tx():
            self.db.execute("UPDATE bench_runs SET folder = ?, finished = ?, error = ? WHERE id = ?",
                            (folder, time.time(), error, run))
            self.db.executemany("INSERT INTO bench_rows VALUES (?, ?)", [(run, json.dumps(r)) for r in rows])

    def judge_bench(self, run: int, verdict: str) -> None:
        with self._tx():
            self.db.execute("UPDATE bench_runs SET verdict = ? WHERE id = ?", (verdict, run))

    def bench_runs(self, stack: str | None = None, *, limit: int = 100) -> list[BenchRun]:
        query = f"SELECT {BENCH_RUN} FROM bench_runs" + (" WHERE stack = ?" if stack else "") + \
            " ORDER BY id DESC LIMIT ?"
        return [self._bench_run(r) for r in self._all(query, (stack, limit) if stack else (limit,))]

    def bench_run(self, run: int) -> BenchRun | None:
        row = self._one(f"SELECT {BENCH_RUN} FROM bench_runs WHERE id = ?", (run,))
        return self._bench_run(row) if row else None

    def mark_known_good(self, stack: str, run: int, image: str) -> None:
        """The stack's image passed its gate in `run`: the pin is known-good, with that provenance."""
        with self._tx():
            self.db.execute("INSERT INTO known_good VALUES (?, ?, ?, ?) ON CONFLICT (stack) DO UPDATE SET "
                            "run = excluded.run, image = excluded.image, at = excluded.at",
                            (stack, run, image, time.time()))

    def known_good(self, stack: str) -> BenchRun | None:
        row = self._one("SELECT run FROM known_good WHERE stack = ?", (stack,))
        return self.bench_run(row[0]) if row else None

    def _bench_run(self, row: tuple) -> BenchRun:
        id_, stack, fingerprint, parts, profile, folder, started, finished, error, verdict = row
        rows = [json.loads(r[0]) for r in self._all("SELECT row FROM bench_rows WHERE run = ? ORDER BY rowid", (id_,))]
        return BenchRun(id_, stack, fingerprint, json.loads(parts), profile, folder, started, finished, error,
                        verdict, rows)

    def interrupt_unfinished(self, reason: str) -> list[int]:
        """Mark deployments a killed process left mid-way as failed; returns their ids."""
        ids = [row[0] for row in self._all("SELECT id FROM deployments WHERE finished IS NULL", ())]
        for deployment in ids:
            self.advance(deployment, Phase.FAILED, "interrupted", error=reason)
        return ids

    def integrity_ok(self) -> bool:
        return self._one("PRAGMA integrity_check", ())[0] == "ok"

    def _one(self, query: str, args: tuple) -> tuple | None:
        with self.lock:
            return self.db.execute(query, args).fetchone()

    def _all(self, query: str, args: tuple) -> list[tuple]:
        with self.lock:
            return self.db.execute(query, args).fetchall()

    def _tx(self) -> _Transaction:
        return _Transaction(self.db, self.lock)

    def _migrate(self) -> None:
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        for number, script in enumerate(MIGRATIONS[version:], version + 1):
            with self._tx():
                for statement in filter(str.strip, script.split(";")):
                    self.db.execute(statement)
                self.db.execute(f"PRAGMA user_version = {number}")


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT (or ROLLBACK on error), for a connection in autocommit mode."""

    def __init__(self, db: sqlite3.Connection, lock: threading.RLock) -> None:
        self.db, self.lock = db, lock

    def __enter__(self) -> sqlite3.Connection:
        self.lock.acquire()
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:  # another process held the write lock past the timeout
            self.lock.release()
            raise TransientError(f"the state database is locked by another process ({e}); is another sparkctl "
                            "writing to the same state dir? Retry, or stop it", delay=1.0) from None
        return self.db

    def __exit__(self, kind: object, *_: object) -> None:
        try:
            self.db.execute("ROLLBACK" if kind else "COMMIT")
        finally:
            self.lock.release()


def _deployment(row: tuple) -> Deployment:
    id_, stack, fingerprint, parts, phase, started, finished, error = row
    return Deployment(id_, stack, fingerprint, json.loads(parts), Phase(phase), started, finished, error)
