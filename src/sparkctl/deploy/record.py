"""A deployment's phases, each shown through the reporter and recorded as a transition in the store.

The store's transitions are the deployment's history (`status` shows the last one). The times
are also kept here, so `up` returns how long the engine took to start, pass its health checks
and its canary (`durations`) as a value: a switch reports them without reading the store back.
The pipeline enters its own steps through `Phases.enter`; the health check reports through
`Phases.health()`, which records each phase once however often it is reported (loading repeats
with every log line).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sparkctl.deploy.progress import Reporter
from sparkctl.phase import Phase
from sparkctl.state.store import Store


@dataclass
class Phases:
    """The phases of one deployment of `stack`; with no deployment (`sparkctl patch check`
    prepares without deploying) they are only reported."""

    store: Store
    reporter: Reporter
    stack: str
    deployment: int | None
    at: dict[Phase, float] = field(default_factory=dict)  # when each phase was first entered

    def enter(self, phase: Phase, detail: str = "", *, error: str | None = None) -> None:
        self.at.setdefault(phase, time.time())
        if self.deployment is not None:
            self.store.deployments.advance(self.deployment, phase, detail, error=error)
        self.reporter.phase(self.stack, phase, detail)

    def health(self) -> Reporter:
        assert self.deployment is not None, "the health check runs within a deployment"
        return _RecordedPhases(self)

    def durations(self) -> dict[str, float]:
        """Engine start (container start to /health 200), health (to the model listed and
        answering) and canary, as far as this deployment got."""
        spans = {"engine_start_s": (Phase.STARTING, Phase.READY), "health_s": (Phase.READY, Phase.CANARY),
                 "canary_s": (Phase.CANARY, Phase.RUNNING)}
        return {name: round(self.at[end] - self.at[start], 3) for name, (start, end) in spans.items()
                if start in self.at and end in self.at}


@dataclass
class _RecordedPhases:
    """The reporter the health check reports through: a new phase is entered (recorded, its
    time kept); a repeated one is only shown."""

    phases: Phases
    last: Phase | None = None

    def phase(self, stack: str, phase: Phase, detail: str = "") -> None:
        if phase is self.last:
            self.phases.reporter.phase(stack, phase, detail)
        else:
            self.phases.enter(phase, detail)
            self.last = phase

    def progress(self, stack: str, task: str, done: int, total: int) -> None:
        self.phases.reporter.progress(stack, task, done, total)

    def note(self, stack: str, text: str) -> None:
        self.phases.reporter.note(stack, text)
