"""Deployments and their phase transitions: one row per `up` of a stack (fingerprint parts,
outcome, error, the KV headroom its engine reported) and the times it entered each phase. The
deploy pipeline writes them; the gateway's routes, the switch and `status` read them."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass

from sparkctl.phase import Phase
from sparkctl.policy.headroom import Headroom
from sparkctl.state.db import Database, where

COLUMNS = "id, stack, fingerprint, parts, phase, started, finished, error, headroom"


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
    headroom: Headroom | None = None  # None: not read (yet), or the engine reported no KV-cache size

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Deployment:
        return cls(row["id"], row["stack"], row["fingerprint"], json.loads(row["parts"]), Phase(row["phase"]),
                   row["started"], row["finished"], row["error"], _headroom(row["headroom"]))


class Deployments:
    def __init__(self, db: Database) -> None:
        self.db = db

    def begin(self, stack: str) -> int:
        now = time.time()
        with self.db.tx() as db:
            cur = db.execute("INSERT INTO deployments (stack, phase, started) VALUES (?, ?, ?)",
                             (stack, Phase.RESOLVING, now))
            db.execute("INSERT INTO transitions VALUES (?, ?, ?, '')", (cur.lastrowid, Phase.RESOLVING, now))
        return cur.lastrowid

    def advance(self, deployment: int, phase: Phase, detail: str = "", *, error: str | None = None) -> None:
        now = time.time()
        finished = now if phase.is_terminal() else None
        with self.db.tx() as db:
            db.execute("UPDATE deployments SET phase = ?, finished = ?, error = COALESCE(?, error) WHERE id = ?",
                       (phase, finished, error, deployment))
            db.execute("INSERT INTO transitions VALUES (?, ?, ?, ?)", (deployment, phase, now, detail))

    def set_fingerprint(self, deployment: int, fingerprint: str, parts: dict[str, str]) -> None:
        with self.db.tx() as db:
            db.execute("UPDATE deployments SET fingerprint = ?, parts = ? WHERE id = ?",
                       (fingerprint, json.dumps(parts, sort_keys=True), deployment))

    def set_headroom(self, deployment: int, headroom: Headroom) -> None:
        with self.db.tx() as db:
            db.execute("UPDATE deployments SET headroom = ? WHERE id = ?",
                       (json.dumps(headroom.as_dict(), sort_keys=True), deployment))

    def headroom(self, stack: str, fingerprint: str) -> Headroom | None:
        """The KV headroom last read for this build of the stack: an `up` that found it running
        unchanged, or a daemon restarted since, still has the one read when it started."""
        row = self.db.one("SELECT headroom FROM deployments WHERE stack = ? AND fingerprint = ? "
                          "AND headroom IS NOT NULL ORDER BY id DESC LIMIT 1", (stack, fingerprint))
        return _headroom(row["headroom"]) if row else None

    def latest(self, stack: str) -> Deployment | None:
        row = self.db.one(f"SELECT {COLUMNS} FROM deployments WHERE stack = ? ORDER BY id DESC LIMIT 1", (stack,))
        return Deployment.from_row(row) if row else None

    def history(self, stack: str | None = None, *, limit: int = 50) -> list[Deployment]:
        clause, args = where(stack, limit)
        return [Deployment.from_row(r) for r in self.db.all(f"SELECT {COLUMNS} FROM deployments" + clause, args)]

    def healthy_fingerprints(self, stack: str) -> set[str]:
        """Fingerprints of the stack's deployments that passed every health phase."""
        rows = self.db.all("SELECT DISTINCT d.fingerprint FROM deployments d JOIN transitions t "
                           "ON t.deployment = d.id WHERE d.stack = ? AND t.phase = ? AND d.fingerprint IS NOT NULL",
                           (stack, Phase.RUNNING))
        return {r["fingerprint"] for r in rows}

    def transitions(self, deployment: int) -> list[tuple[Phase, float, str]]:
        rows = self.db.all("SELECT phase, at, detail FROM transitions WHERE deployment = ? ORDER BY rowid",
                           (deployment,))
        return [(Phase(r["phase"]), r["at"], r["detail"]) for r in rows]

    def interrupt_unfinished(self, reason: str) -> list[int]:
        """Mark deployments a killed process left mid-way as failed; returns their ids."""
        ids = [row["id"] for row in self.db.all("SELECT id FROM deployments WHERE finished IS NULL")]
        for deployment in ids:
            self.advance(deployment, Phase.FAILED, "interrupted", error=reason)
        return ids


def _headroom(text: str | None) -> Headroom | None:
    return Headroom.from_dict(json.loads(text)) if text else None
