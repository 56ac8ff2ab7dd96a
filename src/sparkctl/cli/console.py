"""The CLI's lines for people, all through rich: coloured phase lines and notes, tables that fit the
terminal (`table`, `-o wide` for every column), progress bars for long work, and the stream of
events a daemon action sends back."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from sparkctl.errors import SparkctlError
from sparkctl.phase import Phase

if TYPE_CHECKING:
    from rich.table import Table

    from sparkctl import messages
    from sparkctl.cli.client import DaemonClient

D = TypeVar("D")
STYLE = {Phase.FAILED: "red", Phase.RUNNING: "green", Phase.STOPPED: "yellow"}


def out(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr) as it is now (COLUMNS, a terminal): rich colours on a
    terminal only, and honours NO_COLOR."""
    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def say(text: str, style: str | None = None, *, rest: str = "", stderr: bool = False) -> None:
    """One line: `text` in `style`, then `rest` as it is."""
    out(stderr=stderr).print((f"[{style}]{escape(text)}[/]" if style else escape(text)) + escape(rest))


class Output(StrEnum):
    WIDE = "wide"


OUTPUT = typer.Option(None, "--output", "-o", help="wide: every column (by default a table leaves some out, "
                                                   "so that it fits the terminal).")


@dataclass(frozen=True)
class Column:
    """A table column: `name`, a value people copy (a stack, an alias, an endpoint), kept whole on
    one line; `wide`, shown with `-o wide` only."""

    header: str
    name: bool = False
    wide: bool = False


def table(columns: Sequence[Column], rows: Iterable[Sequence[str]], *, output: Output | None,
          title: str | None = None) -> Table:
    """Every table the CLI prints: the `wide` columns only with `-o wide`; no value ever cut short
    with an ellipsis. Names keep their width; every other value folds onto more lines when the
    terminal is narrow (an image ref included: whole, over two lines)."""
    from rich.table import Table

    shown = [i for i, column in enumerate(columns) if output is Output.WIDE or not column.wide]
    made = Table(*(columns[i].header for i in shown), title=title)
    for i, column in zip(shown, made.columns, strict=True):
        column.overflow = "fold"
        column.no_wrap = columns[i].name
    for row in rows:
        made.add_row(*(row[i] for i in shown))
    return made


def fail(line: str) -> None:
    """The CLI's error line, on stderr."""
    say(line, "red", stderr=True)


class ConsoleReporter:
    """A daemon action's events as they come: a line per phase and note; a progress bar per
    download or build (rich's, started on the first one; transient, so finished bars leave no
    trace)."""

    def __init__(self) -> None:
        self.bars: Any = None
        self.tasks: dict[str, int] = {}

    def __enter__(self) -> ConsoleReporter:
        return self

    def __exit__(self, *_: object) -> None:
        if self.bars is not None:
            self.bars.stop()

    def phase(self, stack: str, phase: Phase, detail: str = "") -> None:
        shown = f" [dim]{escape(detail)}[/]" if detail else ""
        out().print(f"[{STYLE.get(phase, 'cyan')}]{phase:>9}[/] {escape(stack)}{shown}")

    def progress(self, stack: str, task: str, done: int, total: int) -> None:
        if self.bars is None:
            self.bars = _bars()
        if task not in self.tasks:
            self.tasks[task] = self.bars.add_task(escape(task), total=total)
        self.bars.update(self.tasks[task], completed=done, total=total)

    def note(self, stack: str, text: str) -> None:
        say(f"{'note':>9}", "yellow", rest=f" {stack}: {text}")


def through_daemon(daemon: DaemonClient, path: str, request: messages.Asked, expect: type[D]) -> D:
    """Ask the daemon, printing its progress events; returns the outcome's result, of type `expect`.
    The action is named for the daemon (`messages.Asked.action`): a Ctrl-C cancels that action, and
    no other, there (`cancel`), then ends the command (130)."""
    import secrets
    from dataclasses import asdict, replace

    from sparkctl import messages

    request = replace(request, action=request.action or secrets.token_hex(8))
    try:
        with ConsoleReporter() as reporter:
            for line in daemon.stream(path, asdict(request)):
                match messages.decode(line):
                    case messages.PhaseChanged(stack, phase, detail):
                        reporter.phase(stack, Phase(phase), detail)
                    case messages.Progress(stack, task, done, total):
                        reporter.progress(stack, task, done, total)
                    case messages.Note(stack, text):
                        reporter.note(stack, text)
                    case messages.Outcome(ok=False, error=error):
                        raise SparkctlError(error or "the action failed")
                    case messages.Outcome(result=result) if isinstance(result, expect):
                        return result
                    case messages.Outcome(result=result):
                        raise SparkctlError(f"the daemon answered {path} with {type(result).__name__}, not "
                                            f"{expect.__name__}: restart the daemon so that it runs this sparkctl")
    except KeyboardInterrupt:
        cancel(daemon, f"{path.removeprefix('/v1/')} {getattr(request, 'stack', '')}".strip(), request.action)
        raise
    raise SparkctlError("the daemon closed the connection before reporting an outcome; see `sparkctl status`")


def cancel(daemon: DaemonClient, what: str, action: str) -> None:
    """Cancel `action` in the daemon and say what came of it: "cancelled" only when the daemon
    says the action left its queue, or stopped (its answer waits for that)."""
    from sparkctl import messages

    say(f"{what}: cancelling in the daemon", "yellow", stderr=True)
    done = messages.load(messages.Done, daemon.post("/v1/cancel", {"action": action}))
    if not isinstance(done, messages.CancelDone):
        raise SparkctlError(f"the daemon answered /v1/cancel with {type(done).__name__}: restart the daemon so "
                            "that it runs this sparkctl")
    if done.cancelled:
        say(f"{what}: cancelled", "yellow", rest=f": {done.why}", stderr=True)
    else:
        say(f"{what}: not cancelled", "red", rest=f": {done.why}; `sparkctl status` shows it", stderr=True)


def _bars() -> Any:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    bars = Progress(TextColumn("  {task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    console=out(), transient=True)
    bars.start()
    return bars
