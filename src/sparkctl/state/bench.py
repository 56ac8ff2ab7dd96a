"""Benchmark runs: what ran (the deployment's parts, the profile), its rows per depth and
concurrency, the gate's verdict, and each stack's last known-good run (the provenance of its
pinned image)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from sparkctl.state.db import Database, where

COLUMNS = "id, stack, fingerprint, parts, profile, folder, started, finished, error, verdict"


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


class BenchRuns:
    def __init__(self, db: Database) -> None:
        self.db = db

    def begin(self, stack: str, fingerprint: str | None, parts: dict[str, str], profile: str) -> int:
        with self.db.tx() as db:
            cur = db.execute("INSERT INTO bench_runs (stack, fingerprint, parts, profile, started) "
                             "VALUES (?, ?, ?, ?, ?)",
                             (stack, fingerprint, json.dumps(parts, sort_keys=True), profile, time.time()))
        return cur.lastrowid

    def finish(self, run: int, *, folder: str, rows: list[dict], error: str | None = None) -> None:
        with self.db.tx() as db:
            db.execute("UPDATE bench_runs SET folder = ?, finished = ?, error = ? WHERE id = ?",
                       (folder, time.time(), error, run))
            db.executemany("INSERT INTO bench_rows VALUES (?, ?)", [(run, json.dumps(r)) for r in rows])

    def judge(self, run: int, verdict: str) -> None:
        with self.db.tx() as db:
            db.execute("UPDATE bench_runs SET verdict = ? WHERE id = ?", (verdict, run))

    def runs(self, stack: str | None = None, *, limit: int = 100) -> list[BenchRun]:
        clause, args = where(stack, limit)
        return [self._run(r) for r in self.db.all(f"SELECT {COLUMNS} FROM bench_runs" + clause, args)]

    def run(self, run: int) -> BenchRun | None:
        row = self.db.one(f"SELECT {COLUMNS} FROM bench_runs WHERE id = ?", (run,))
        return self._run(row) if row else None

    def mark_known_good(self, stack: str, run: int, image: str) -> None:
        """The stack's image passed its gate in `run`: the pin is known-good, with that provenance."""
        with self.db.tx() as db:
            db.execute("INSERT INTO known_good VALUES (?, ?, ?, ?) ON CONFLICT (stack) DO UPDATE SET "
                       "run = excluded.run, image = excluded.image, at = excluded.at", (stack, run, image, time.time()))

    def known_good(self, stack: str) -> BenchRun | None:
        row = self.db.one("SELECT run FROM known_good WHERE stack = ?", (stack,))
        return self.run(row["run"]) if row else None

    def _run(self, row) -> BenchRun:
        rows = [json.loads(r["row"]) for r in self.db.all("SELECT row FROM bench_rows WHERE run = ? ORDER BY rowid",
                                                          (row["id"],))]
        return BenchRun(row["id"], row["stack"], row["fingerprint"], json.loads(row["parts"]), row["profile"],
                        row["folder"], row["started"], row["finished"], row["error"], row["verdict"], rows)
