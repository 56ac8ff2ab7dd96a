"""How the pipeline tells people what it is doing: a small reporter interface.

The CLI implements it with rich (phases, progress bars); tests record calls; the daemon will
turn calls into events for its API. The pipeline never prints.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Protocol

from sparkctl.errors import SparkctlError
from sparkctl.phase import Phase


class Reporter(Protocol):
    def phase(self, stack: str, phase: Phase, detail: str = "") -> None: ...

    def progress(self, stack: str, task: str, done: int, total: int) -> None: ...

    def note(self, stack: str, text: str) -> None: ...


@dataclass
class RecordingReporter:
    """Keeps every call, for tests and for callers that report afterwards."""

    phases: list[tuple[str, Phase, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    progressed: dict[str, tuple[int, int]] = field(default_factory=dict)

    def phase(self, stack: str, phase: Phase, detail: str = "") -> None:
        self.phases.append((stack, phase, detail))

    def progress(self, stack: str, task: str, done: int, total: int) -> None:
        self.progressed[task] = (done, total)

    def note(self, stack: str, text: str) -> None:
        self.notes.append(text)


class Stopped(SparkctlError):
    """A fetch stream stopped because another one failed, or a `down` came while it ran."""


@dataclass
class Stoppable:
    """A reporter for streams that run at once: once `stop` is set, the next progress a stream
    reports raises `Stopped` in it (a pull's or a download's own thread), so every stream ends."""

    reporter: Reporter
    stop: threading.Event
    why: str = "stopped"

    def phase(self, stack: str, phase: Phase, detail: str = "") -> None:
        self.reporter.phase(stack, phase, detail)

    def progress(self, stack: str, task: str, done: int, total: int) -> None:
        if self.stop.is_set():
            raise Stopped(f"{task}: {self.why}")
        self.reporter.progress(stack, task, done, total)

    def note(self, stack: str, text: str) -> None:
        self.reporter.note(stack, text)


def moved_note(tagged: str, known: str, moved: str) -> str:
    """What an `up` says of a pinned tag the registry now serves another digest for."""
    return (f"tag {tagged} has moved: pinned {known[:19]}, registry now {moved[:19]}; running the pinned digest "
            "(`sparkctl up --refresh` follows the tag)")
