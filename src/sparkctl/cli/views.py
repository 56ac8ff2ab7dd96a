"""What `status`, `stacks list` and `up` print, from the daemon's answers."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING

from sparkctl.cli.console import Column, Output, out, say, table, through_daemon

if TYPE_CHECKING:
    from sparkctl.cli.client import DaemonClient
    from sparkctl.messages import StackRow, Status, StatusRow


STATUS = (Column("stack", name=True), Column("phase"), Column("endpoint", name=True),
          Column("fingerprint", wide=True), Column("uptime"), Column("memory"))
STACKS = (Column("stack", name=True), Column("kind", wide=True), Column("image"), Column("model", wide=True),
          Column("draft", wide=True), Column("mem", wide=True), Column("port", wide=True), Column("policy"),
          Column("source"))


def status(report: Status, *, as_json: bool, output: Output | None) -> None:
    """Every sparkctl container of the instance, then each engine's KV headroom, then the other
    instances that share the engine (`report` as the daemon's `/v1/status` has it)."""
    rows, others = report.stacks, report.others
    if as_json:
        print(json.dumps([asdict(row) for row in rows], indent=2))
        return
    if rows:
        out().print(table(STATUS, (_status_row(row) for row in rows), output=output))
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


def stacks(rows: tuple[StackRow, ...], *, output: Output | None) -> None:
    """One row per deployable stack, with what the image policy says of it; one per file left
    out of the catalog, with its error."""
    out().print(table(STACKS, (_stack_row(row) for row in rows), output=output))


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


def _status_row(row: StatusRow) -> tuple[str, ...]:
    memory = f"{row.memory:.2f}" if row.memory is not None else ""
    return (row.stack, row.phase, row.endpoint, (row.fingerprint or "")[:12], duration(row.uptime_s), memory)


def _stack_row(row: StackRow) -> tuple[str, ...]:
    from rich.markup import escape

    if row.invalid:
        invalid = f"[red]invalid, left out[/]: {escape(row.invalid)}"
        return (escape(row.stack), row.kind, "-", "-", "-", "-", "-", invalid, row.source)
    verdict = f"[red]refused[/]: {escape(row.policy)}" if row.refused else escape(row.policy)
    return (row.stack, row.kind, row.image, row.model, row.draft, f"{row.memory:.2f}", str(row.port), verdict,
            row.source)
