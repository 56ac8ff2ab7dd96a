"""The CLI's lines for people: coloured phase lines and notes, rich's progress bars for long work,
and the stream of events a daemon action sends back. Standard library at import: a call the
daemon answers at once prints its lines without loading rich, which comes in with the first bar.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from sparkctl.errors import SparkctlError
from sparkctl.phase import Phase

if TYPE_CHECKING:
    from sparkctl import wire
    from sparkctl.cli.client import DaemonClient

D = TypeVar("D")
STYLE = {Phase.FAILED: "red", Phase.RUNNING: "green", Phase.STOPPED: "yellow"}
CODES = {"red": 31, "green": 32, "yellow": 33, "cyan": 36, "dim": 2}


def paint(text: str, style: str, stream: TextIO | None = None) -> str:
    """`text` in `style` where rich would colour it: on a terminal, unless NO_COLOR (or TERM=dumb)
    says not to, or FORCE_COLOR asks for it anyway."""
    stream = stream or sys.stdout
    if os.environ.get("NO_COLOR") or not (os.environ.get("FORCE_COLOR") or _terminal(stream)):
        return text
    return f"\x1b[{CODES[style]}m{text}\x1b[0m"


def say(text: str, style: str | None = None, *, rest: str = "") -> None:
    """One line on stdout: `text` painted, then `rest` as it is."""
    print((paint(text, style) if style else text) + rest, flush=True)


def fail(line: str) -> None:
    """The CLI's error line, on stderr."""
    print(paint(line, "red", sys.stderr), file=sys.stderr, flush=True)


class ConsoleReporter:
    """The deploy pipeline's reporter: a line per phase and note; a progress bar per download or
    build (rich's, started on the first one; transient, so finished bars leave no trace). Files
    download in parallel: their threads report at once."""

    def __init__(self) -> None:
        self.bars: Any = None
        self.tasks: dict[str, int] = {}
        self.lock = threading.Lock()

    def __enter__(self) -> ConsoleReporter:
        return self

    def __exit__(self, *_: object) -> None:
        if self.bars is not None:
            self.bars.stop()

    def phase(self, stack: str, phase: Phase, detail: str = "") -> None:
        say(f"{phase:>9}", STYLE.get(phase, "cyan"), rest=f" {stack}" + (f" {paint(detail, 'dim')}" if detail else ""))

    def progress(self, stack: str, task: str, done: int, total: int) -> None:
        with self.lock:
            if self.bars is None:
                self.bars = _bars()
            if task not in self.tasks:
                from rich.markup import escape

                self.tasks[task] = self.bars.add_task(escape(task), total=total)
            self.bars.update(self.tasks[task], completed=done, total=total)

    def note(self, stack: str, text: str) -> None:
        say(f"{'note':>9}", "yellow", rest=f" {stack}: {text}")


def through_daemon(daemon: DaemonClient, path: str, request: wire.Request, expect: type[D]) -> D:
    """Ask the daemon, printing its progress events; returns the outcome's result, of type `expect`."""
    from dataclasses import asdict

    from sparkctl import wire

    with ConsoleReporter() as reporter:
        for line in daemon.stream(path, asdict(request)):
            match wire.decode(line):
                case wire.PhaseChanged(stack, phase, detail):
                    reporter.phase(stack, Phase(phase), detail)
                case wire.Progress(stack, task, done, total):
                    reporter.progress(stack, task, done, total)
                case wire.Note(stack, text):
                    reporter.note(stack, text)
                case wire.Outcome(ok=False, error=error):
                    raise SparkctlError(error or "the action failed")
                case wire.Outcome(result=result) if isinstance(result, expect):
                    return result
                case wire.Outcome(result=result):
                    raise SparkctlError(f"the daemon answered {path} with {type(result).__name__}, not "
                                        f"{expect.__name__}: restart the daemon so that it runs this sparkctl")
    raise SparkctlError("the daemon closed the connection before reporting an outcome; see `sparkctl status`")


def _terminal(stream: TextIO) -> bool:
    return stream.isatty() and os.environ.get("TERM") != "dumb"


def _bars() -> Any:
    from rich.console import Console  # ~60 ms: only once there is a bar to draw
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    bars = Progress(TextColumn("  {task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    console=Console(highlight=False), transient=True)
    bars.start()
    return bars
