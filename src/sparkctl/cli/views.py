"""What `status`, `stacks list` and `up` print, from the daemon's answers."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from sparkctl.cli.console import out, say, through_daemon

if TYPE_CHECKING:
    from sparkctl.cli.client import DaemonClient
    from sparkctl.messages import StackRow, Status, StatusRow


def status(report: Status, *, as_json: bool) -> None:
    """Every sparkctl container of the instance, then each engine's KV headroom, then the other
    instances that share the engine (`report` as the daemon's `/v1/status` has it)."""
    rows, others = report.stacks, report.others
    if as_json:
        print(json.dumps([asdict(row) for row in rows], indent=2))
        return
    console = out()
    if rows:
        console.print(_status_table(rows, wide=console.width >= 100))
    else:
        say(f"no stacks are deployed (instance {report.instance})")
    for row in rows:
        if row.kv:
            say(f"{row.stack}: {row.kv.summary}")
            for warning in row.kv.warnings:
                say("warning", "yellow", rest=f" {row.stack}: {warning}")
    if others:
        listed = "; ".join(f"{name}: {', '.join(stacks)}" for name, stacks in others.items())
        say(f"other sparkctl instances on this engine (not touched): {listed}", "dim")


def stacks(rows: tuple[StackRow, ...]) -> None:
    """One row per deployable stack, with what the image policy says of it; one per file left
    out of the catalog, with its error."""
    from rich.markup import escape
    from rich.table import Table

    table = Table("stack", "kind", "image", "model", "draft", "mem", "port", "policy", "source")
    table.columns[0].no_wrap = True
    for row in rows:
        if row.invalid:
            table.add_row(escape(row.stack), row.kind, "-", "-", "-", "-", "-",
                          f"[red]invalid, left out[/]: {escape(row.invalid)}", row.source)
            continue
        verdict = f"[red]refused[/]: {escape(row.policy)}" if row.refused else escape(row.policy)
        table.add_row(row.stack, row.kind, row.image, row.model, row.draft, f"{row.memory:.2f}", str(row.port),
                      verdict, row.source)
    out().print(table)


def up(daemon: DaemonClient, stack: str, *, refresh: bool = False, replace: bool = False) -> None:
    """`up` through the daemon: its phases as they come, then one line."""
    from sparkctl import messages

    done = through_daemon(daemon, "/v1/up", messages.UpRequest(stack, refresh, replace), messages.UpDone)
    extra = f", speculative acceptance {done.acceptance:.2f}" if done.acceptance is not None else ""
    verb = "already up, unchanged" if done.unchanged else "up"
    say(f"{stack} {verb}", "green", rest=f": {done.url}/v1 (fingerprint {done.fingerprint}{extra})")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, s = divmod(int(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m" if hours else f"{m}m{s:02d}s"


def _status_table(rows: tuple[StatusRow, ...], *, wide: bool) -> Any:
    """A narrow terminal drops the fingerprint (`--json` has it) before folding; the endpoint stays
    whole, since it is copied from here."""
    from rich.table import Table

    table = Table("stack", "phase", "endpoint", *(["fingerprint"] if wide else []), "uptime", "memory")
    for column in table.columns:
        column.overflow = "fold"
    table.columns[2].no_wrap = True
    table.columns[2].min_width = max(len(row.endpoint) for row in rows)
    for row in rows:
        fingerprint = [(row.fingerprint or "")[:12]] if wide else []
        table.add_row(row.stack, row.phase, row.endpoint, *fingerprint, duration(row.uptime_s),
                      f"{row.memory:.2f}" if row.memory is not None else "")
    return table
