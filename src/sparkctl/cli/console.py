"""The deploy pipeline's reporter for people: phase lines and rich progress bars."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from sparkctl.phase import Phase

STYLE = {Phase.FAILED: "red", Phase.RUNNING: "green", Phase.STOPPED: "yellow"}


class ConsoleReporter:
    def __init__(self, console: Console) -> None:
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn  # ~10 ms

        self.console = console
        self.bars = Progress(TextColumn("  {task.description}"), BarColumn(), DownloadColumn(),
                             TransferSpeedColumn(), console=console, transient=True)
        self.tasks: dict[str, int] = {}

    def __enter__(self) -> ConsoleReporter:
        self.bars.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.bars.stop()

    def phase(self, stack: str, phase: Phase, detail: str = "") -> None:
        style = STYLE.get(phase, "cyan")
        suffix = f" [dim]{escape(detail)}[/]" if detail else ""
        self.console.print(f"[{style}]{phase:>9}[/] {escape(stack)}{suffix}")

    def progress(self, stack: str, task: str, done: int, total: int) -> None:
        if task not in self.tasks:
            self.tasks[task] = self.bars.add_task(escape(task), total=total)
        self.bars.update(self.tasks[task], completed=done, total=total)

    def note(self, stack: str, text: str) -> None:
        self.console.print(f"[yellow]{'note':>9}[/] {escape(stack)}: {escape(text)}")
