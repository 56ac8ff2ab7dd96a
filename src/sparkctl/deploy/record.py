"""A deployment's phases, each shown through the reporter and recorded as a transition in the store.

The store's transitions are the deployment's history: `status` shows the last one and a switch
reads engine start and canary times from them. The pipeline enters its own steps through
`Phases.enter`; the health check reports through `Phases.health()`, which records each phase
once however often it is reported (loading repeats with every log line).
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkctl.deploy.progress import Reporter
from sparkctl.phase import Phase
from sparkctl.state.store import Store


@dataclass(frozen=True)
class Phases:
    """The phases of one deployment of `stack`; with no deployment (`sparkctl patch check`
    prepares without deploying) they are only reported."""

    store: Store
    reporter: Reporter
    stack: str
    deployment: int | None

    def enter(self, phase: Phase, detail: str = "", *, error: str | None = None) -> None:
        if self.deployment is not None:
            self.store.deployments.advance(self.deployment, phase, detail, error=error)
        self.reporter.phase(self.stack, phase, detail)

    def health(self) -> Reporter:
        assert self.deployment is not None, "the health check runs within a deployment"
        return _RecordedPhases(self.reporter, self.store, self.deployment)


@dataclass
class _RecordedPhases:
    """The reporter, with each new health phase also recorded in the deployment's transitions
    (a switch reads engine start and canary times from them)."""

    reporter: Reporter
    store: Store
    deployment: int
    last: Phase | None = None

    def phase(self, stack: str, phase: Phase, detail: str = "") -> None:
        if phase is not self.last:
            self.store.deployments.advance(self.deployment, phase, detail)
            self.last = phase
        self.reporter.phase(stack, phase, detail)

    def progress(self, stack: str, task: str, done: int, total: int) -> None:
        self.reporter.progress(stack, task, done, total)

    def note(self, stack: str, text: str) -> None:
        self.reporter.note(stack, text)
