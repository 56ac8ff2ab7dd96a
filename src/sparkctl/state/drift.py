"""Greedy runs: a deployment's outputs of sparkctl's fixed prompts at temperature 0
(`bench/drift.py`), stored with the deployment they came from (fingerprint and parts: image
digest, model and draft commits, patch-set hash, spec hash), its model repo, whether it
speculates, the key of the prompt set asked (prompts, max_tokens and seed), and the drift gate's
verdict. Later builds of the stack, and its speculative twins, are compared with the passing ones."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from sparkctl.state.db import Database, where

COLUMNS = "id, stack, fingerprint, parts, model, speculative, prompts, at, outputs, verdict"


@dataclass(frozen=True)
class Output:
    """One reply: its text and, where the engine returned them, its token ids."""

    text: str
    tokens: tuple[int, ...] | None = None


@dataclass(frozen=True)
class GreedyRun:
    id: int
    stack: str
    fingerprint: str | None
    parts: dict[str, str]
    model: str  # the model repo ("" for a stack that names none)
    speculative: bool
    prompts: str  # the prompt set's key: the same key, the same requests
    at: float
    outputs: tuple[Output, ...]
    verdict: str | None  # "pass" or "fail: <why>"


class GreedyRuns:
    def __init__(self, db: Database) -> None:
        self.db = db

    def record(self, stack: str, fingerprint: str | None, parts: dict[str, str], *, model: str, speculative: bool,
               prompts: str, outputs: list[Output]) -> int:
        stored = json.dumps([{"text": o.text, "tokens": list(o.tokens) if o.tokens is not None else None}
                             for o in outputs])
        with self.db.tx() as db:
            cur = db.execute("INSERT INTO greedy_runs (stack, fingerprint, parts, model, speculative, prompts, at, "
                             "outputs) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                             (stack, fingerprint, json.dumps(parts, sort_keys=True), model, int(speculative), prompts,
                              time.time(), stored))
        return cur.lastrowid

    def judge(self, run: int, verdict: str) -> None:
        with self.db.tx() as db:
            db.execute("UPDATE greedy_runs SET verdict = ? WHERE id = ?", (verdict, run))

    def run(self, run: int) -> GreedyRun | None:
        row = self.db.one(f"SELECT {COLUMNS} FROM greedy_runs WHERE id = ?", (run,))
        return _run(row) if row else None

    def runs(self, stack: str | None = None, *, limit: int = 100) -> list[GreedyRun]:
        clause, args = where(stack, limit)
        return [_run(r) for r in self.db.all(f"SELECT {COLUMNS} FROM greedy_runs" + clause, args)]

    def passed(self, *, prompts: str, model: str, limit: int = 200) -> list[GreedyRun]:
        """The passing runs of every stack on the same prompt set and model repo, newest first:
        where a run's earlier builds and its twins are looked for."""
        rows = self.db.all(f"SELECT {COLUMNS} FROM greedy_runs WHERE prompts = ? AND model = ? AND verdict = 'pass' "
                           "ORDER BY id DESC LIMIT ?", (prompts, model, limit))
        return [_run(r) for r in rows]


def _run(row) -> GreedyRun:
    outputs = tuple(Output(o["text"], tuple(o["tokens"]) if o["tokens"] is not None else None)
                    for o in json.loads(row["outputs"]))
    return GreedyRun(row["id"], row["stack"], row["fingerprint"], json.loads(row["parts"]), row["model"],
                     bool(row["speculative"]), row["prompts"], row["at"], outputs, row["verdict"])
