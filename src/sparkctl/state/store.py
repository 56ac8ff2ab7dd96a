"""The state store: the state database (`db.py`) and the repositories over it, opened once per
process. Deployments and their transitions, benchmark runs and known-good pins, quality runs, greedy runs, events,
switches, resolved digests and the image policy's records each have their own repository; the
daemon (with the deploy pipeline and the benchmarks it runs) writes them, `status`, `history` and
the report read them; the CLI opens the store read-only. Every write is its own short
transaction.
"""

from __future__ import annotations

from pathlib import Path

from sparkctl.spec.imagefile import PolicyFiles
from sparkctl.state.bench import BenchRuns
from sparkctl.state.db import Database
from sparkctl.state.deployments import Deployments
from sparkctl.state.drift import GreedyRuns
from sparkctl.state.images import ImageRecords
from sparkctl.state.journal import Answers, Digests, Events, Switches
from sparkctl.state.quality import QualityRuns


class Store:
    def __init__(self, path: Path, *, timeout: float = 30, readonly: bool = False,
                 policy_files: PolicyFiles | None = None) -> None:
        """`policy_files`: the image policy's read-only files, under the records (none: records only)."""
        self.db = Database(path, timeout=timeout, readonly=readonly)
        self.deployments = Deployments(self.db)
        self.bench = BenchRuns(self.db)
        self.quality = QualityRuns(self.db)
        self.greedy = GreedyRuns(self.db)
        self.events = Events(self.db)
        self.switches = Switches(self.db)
        self.digests = Digests(self.db)
        self.answers = Answers(self.db)
        self.images = ImageRecords(self.db, policy_files or PolicyFiles())

    def integrity_ok(self) -> bool:
        return self.db.integrity_ok()

    def close(self) -> None:
        self.db.close()
