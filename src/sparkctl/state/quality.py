"""Quality runs: lm-eval's accuracy on a task (`bench/quality.py`), stored with the deployment it
measured (fingerprint and parts: image digest, model and draft commits, patch-set hash, spec
hash), the tool that measured it, and the gate's verdict. A stack's last passing run on the same
task and number of items is the baseline of its `max_drop`."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from sparkctl.state.db import Database, where

COLUMNS = ("id, stack, fingerprint, parts, task, items, started, finished, accuracy, stderr, tool, folder, error, "
           "verdict")


@dataclass(frozen=True)
class QualityRun:
    id: int
    stack: str
    fingerprint: str | None
    parts: dict[str, str]
    task: str
    items: int  # asked for; once finished, the items lm-eval scored
    started: float
    finished: float | None
    accuracy: float | None  # the share scored right, 0 to 1; None until finished, or when it failed
    stderr: float | None  # lm-eval's standard error of the accuracy
    tool: str  # what measured it: "lm-eval 0.4.13"
    folder: str
    error: str | None
    verdict: str | None  # the gate's: "pass" or "fail: <why>"

    def interval(self) -> tuple[float, float] | None:
        """The accuracy's 95 % confidence interval (± 1.96 standard errors, within 0 to 1), if known."""
        if self.accuracy is None or not self.stderr:
            return None
        return max(0.0, self.accuracy - 1.96 * self.stderr), min(1.0, self.accuracy + 1.96 * self.stderr)

    def summary(self) -> str:
        """In one phrase: the task, the accuracy with its 95 % confidence interval, the items, the tool."""
        if self.accuracy is None:
            return f"{self.task} not measured: {self.error or 'no result'}"
        interval = self.interval()
        ci = f" (95% CI {_pct(interval[0])}–{_pct(interval[1])})" if interval else ""
        return f"{self.task} {_pct(self.accuracy)}{ci} over {self.items} items ({self.tool})"


@dataclass(frozen=True)
class Measured:
    """What one lm-eval run measured."""

    items: int
    accuracy: float
    stderr: float | None
    tool: str


class QualityRuns:
    def __init__(self, db: Database) -> None:
        self.db = db

    def begin(self, stack: str, fingerprint: str | None, parts: dict[str, str], *, task: str, items: int) -> int:
        with self.db.tx() as db:
            cur = db.execute("INSERT INTO quality_runs (stack, fingerprint, parts, task, items, started) "
                             "VALUES (?, ?, ?, ?, ?, ?)",
                             (stack, fingerprint, json.dumps(parts, sort_keys=True), task, items, time.time()))
        return cur.lastrowid

    def finish(self, run: int, *, folder: str, measured: Measured | None = None, error: str | None = None) -> None:
        with self.db.tx() as db:
            db.execute("UPDATE quality_runs SET folder = ?, finished = ?, error = ? WHERE id = ?",
                       (folder, time.time(), error, run))
            if measured is not None:
                db.execute("UPDATE quality_runs SET items = ?, accuracy = ?, stderr = ?, tool = ? WHERE id = ?",
                           (measured.items, measured.accuracy, measured.stderr, measured.tool, run))

    def judge(self, run: int, verdict: str) -> None:
        with self.db.tx() as db:
            db.execute("UPDATE quality_runs SET verdict = ? WHERE id = ?", (verdict, run))

    def runs(self, stack: str | None = None, *, limit: int = 100) -> list[QualityRun]:
        clause, args = where(stack, limit)
        return [_run(r) for r in self.db.all(f"SELECT {COLUMNS} FROM quality_runs" + clause, args)]

    def run(self, run: int) -> QualityRun | None:
        row = self.db.one(f"SELECT {COLUMNS} FROM quality_runs WHERE id = ?", (run,))
        return _run(row) if row else None

    def last_pass(self, stack: str, *, task: str, items: int) -> QualityRun | None:
        """The stack's newest run on the same questions (task and items) that passed its gate."""
        row = self.db.one(f"SELECT {COLUMNS} FROM quality_runs WHERE stack = ? AND task = ? AND items = ? "
                          "AND verdict = 'pass' ORDER BY id DESC LIMIT 1", (stack, task, items))
        return _run(row) if row else None


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.1f}%"


def _run(row) -> QualityRun:
    return QualityRun(row["id"], row["stack"], row["fingerprint"], json.loads(row["parts"]), row["task"],
                      row["items"], row["started"], row["finished"], row["accuracy"], row["stderr"], row["tool"],
                      row["folder"], row["error"], row["verdict"])
