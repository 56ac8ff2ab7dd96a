"""The state database: one SQLite file in the state dir (WAL, private), its numbered schema
migrations, and short write transactions. The repositories (`deployments.py`, `bench.py`,
`quality.py`, `drift.py`, `journal.py`, `images.py`) read and write through it; `store.py` opens
it and hands it to them.

Rows come back as `sqlite3.Row`, read by column name: a migration that adds a column changes
no reader.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sparkctl.errors import SparkctlError, TransientError

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
    # A deployment's KV headroom (policy.headroom.Headroom as JSON), read once it runs.
    "ALTER TABLE deployments ADD COLUMN headroom TEXT",
    # What the last deploy of a stack that ended running was made from, as JSON (dropped below).
    "CREATE TABLE made (stack TEXT PRIMARY KEY, record TEXT NOT NULL)",
    # What a registry last answered for a pinned tag, and when (deploy/image.py asks once a minute).
    "CREATE TABLE answers (ref TEXT PRIMARY KEY, digest TEXT NOT NULL, asked REAL NOT NULL)",
    # An unchanged `up` runs the pipeline, which finds its engine's fingerprint running: no record kept.
    "DROP TABLE made",
    # The quality gate's runs (state/quality.py): lm-eval's accuracy on a task, with the deployment's parts.
    """
    CREATE TABLE quality_runs (
        id INTEGER PRIMARY KEY,
        stack TEXT NOT NULL,
        fingerprint TEXT,
        parts TEXT NOT NULL DEFAULT '{}',
        task TEXT NOT NULL,
        items INTEGER NOT NULL,
        started REAL NOT NULL,
        finished REAL,
        accuracy REAL,
        stderr REAL,
        tool TEXT NOT NULL DEFAULT '',
        folder TEXT NOT NULL DEFAULT '',
        error TEXT,
        verdict TEXT
    );
    CREATE INDEX quality_runs_stack ON quality_runs (stack, task, id);
    """,
    # The image policy's state layer (state/images.py): what sparkctl records over the read-only
    # images.yaml files, one row per entry (entry NULL: a file's entry lifted). `imports` holds
    # what is still to be imported once, from files an older version wrote into.
    """
    CREATE TABLE image_policy (
        section TEXT NOT NULL,
        key TEXT NOT NULL,
        entry TEXT,
        at REAL NOT NULL,
        PRIMARY KEY (section, key)
    );
    CREATE TABLE imports (what TEXT PRIMARY KEY);
    INSERT INTO imports VALUES ('images.yaml');
    """,
    # Greedy drift (state/drift.py): a deployment's outputs of the fixed prompts at temperature 0.
    """
    CREATE TABLE greedy_runs (
        id INTEGER PRIMARY KEY,
        stack TEXT NOT NULL,
        fingerprint TEXT,
        parts TEXT NOT NULL DEFAULT '{}',
        model TEXT NOT NULL DEFAULT '',
        speculative INTEGER NOT NULL DEFAULT 0,
        prompts TEXT NOT NULL,
        at REAL NOT NULL,
        outputs TEXT NOT NULL,
        verdict TEXT
    );
    CREATE INDEX greedy_runs_prompts ON greedy_runs (prompts, model, id);
    """,
)


class Database:
    def __init__(self, path: Path, *, timeout: float = 30, readonly: bool = False) -> None:
        """`readonly`: the CLI's, whose reads change nothing (the daemon writes the store): the
        file opened read-only, as its writer made it, with no migration; absent, an error."""
        self.readonly = readonly
        if readonly:
            self._open_readonly(path, timeout)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600, exist_ok=True)
        path.chmod(0o600)  # private (older versions made it 0644): it names stacks, digests and history
        self.path = path
        # The daemon shares one store between its threads: one connection, one lock.
        self.db = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.lock = threading.RLock()
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            # A commit is written to the WAL without an fsync of its own (the WAL is synced at
            # checkpoints): a crash of sparkctl loses nothing, a power cut may lose the last commits
            # but never the database. An fsync per commit cost 1-10 ms each, a dozen per `up`.
            self.db.execute("PRAGMA synchronous=NORMAL")
            self._migrate()
        except sqlite3.DatabaseError as e:
            raise SparkctlError(f"{path}: the state database is unreadable ({e}); move it aside and sparkctl "
                                "starts a new one (deployment and benchmark history are then lost)") from None

    def _open_readonly(self, path: Path, timeout: float) -> None:
        self.path, self.lock = path, threading.RLock()
        try:
            self.db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=timeout,
                                      isolation_level=None, check_same_thread=False)
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA user_version").fetchone()
        except sqlite3.Error as e:
            raise SparkctlError(f"{path}: the state database cannot be read ({e}); the daemon makes it at its start "
                                "(`sparkctl status` starts one)") from None

    def close(self) -> None:
        self.db.close()

    def one(self, query: str, args: tuple = ()) -> sqlite3.Row | None:
        with self.lock:
            return self.db.execute(query, args).fetchone()

    def all(self, query: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self.lock:
            return self.db.execute(query, args).fetchall()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT (or ROLLBACK on error, a failed COMMIT's included: the
        connection is shared, so a transaction left open would show its rows to every read and
        refuse every later write), for a connection in autocommit mode."""
        with self.lock:
            try:
                self.db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:  # another process held the write lock past the timeout
                raise TransientError(f"the state database is locked by another process ({e}); is another "
                                     "sparkctl writing to the same state dir? Retry, or stop it", delay=1.0) from None
            try:
                yield self.db
                self._commit()
            except BaseException:
                if self.db.in_transaction:  # a failed COMMIT leaves it open; SQLITE_FULL may have ended it
                    self.db.execute("ROLLBACK")
                raise

    def _commit(self) -> None:
        try:
            self.db.execute("COMMIT")
        except sqlite3.Error as e:  # a full disk, an I/O error, a deferred constraint
            raise SparkctlError(f"{self.path}: the state database could not commit a write ({e}); nothing of it "
                                "was kept. Free space in the state dir if it is full, and retry") from e

    def integrity_ok(self) -> bool:
        return self.one("PRAGMA integrity_check")[0] == "ok"

    def _migrate(self) -> None:
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        for number, script in enumerate(MIGRATIONS[version:], version + 1):
            with self.tx():
                for statement in filter(str.strip, script.split(";")):
                    self.db.execute(statement)
                self.db.execute(f"PRAGMA user_version = {number}")


def where(stack: str | None, limit: int) -> tuple[str, tuple]:
    """The optional `WHERE stack = ?` and the limit of a newest-first listing, with their args."""
    return (" WHERE stack = ?" if stack else "") + " ORDER BY rowid DESC LIMIT ?", \
        ((stack, limit) if stack else (limit,))
