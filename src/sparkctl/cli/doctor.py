"""`sparkctl doctor [STACK…]`: whether this Spark is ready for its stacks (the desired ones, or
those named), in seconds and starting nothing. Runs in the CLI's own process (a doctor must
answer when no daemon runs, or none can start); the checks are `sparkctl.doctor`'s, imported when
the command runs (the CLI's start imports no heavy library)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer

from sparkctl.cli.runtime import Runtime, runtime
from sparkctl.errors import SparkctlError

if TYPE_CHECKING:
    from sparkctl.doctor import Report
    from sparkctl.doctor.host import DaemonFacts

AREAS = ("docker", "compose", "nvidia", "gpu", "memory", "registry", "hub", "stacks", "disk", "daemon", "port",
         "spark", "sentinel")
STYLE = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[red]fail[/]"}


def doctor(ctx: typer.Context,
           stacks: list[str] = typer.Argument(None, help="Stacks to check (default: the desired ones)."),
           only: str = typer.Option("", "--only", help=f"Comma-separated areas: {', '.join(AREAS)}."),
           as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Check this Spark is ready before the first `up`: Docker, compose, the NVIDIA runtime and GPU,
    memory, registries and the Hub (and the HF token's access), each stack's image, disk, the
    daemon and the gateway's port; what has frozen GB10 hosts (logind's RemoveIPC, the driver,
    usable memory, swap, /dev/shm, the allocator), the kernel log the sentinel can read, and the
    last words of a daemon run that did not stop cleanly. Exit 1 when a check fails; each failure names its fix."""
    rt = runtime(ctx)
    areas = {a.strip() for a in only.split(",") if a.strip()}
    if unknown := areas - set(AREAS):
        raise SparkctlError(f"no check area {', '.join(sorted(unknown))}; the areas: {', '.join(AREAS)}")
    report = diagnose(rt, tuple(stacks or ()), areas)
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        _print(rt, report)
    if report.failed:
        raise typer.Exit(1)


def diagnose(rt: Runtime, named: tuple[str, ...], areas: set[str]) -> Report:
    from sparkctl.doctor import examine, gb10
    from sparkctl.doctor import host as on_host
    from sparkctl.doctor import stacks as for_stacks
    from sparkctl.doctor.spark import Spark

    spark = Spark(rt.settings, rt.wiring, named)
    facts = _daemon(rt)
    return examine([
        ("docker", lambda: on_host.docker(spark)), ("compose", lambda: on_host.compose_v2(spark)),
        ("nvidia", lambda: on_host.nvidia(spark)), ("gpu", lambda: on_host.gpu(spark)),
        ("memory", lambda: on_host.memory(spark)), ("registry", lambda: for_stacks.registries(spark)),
        ("hub", lambda: for_stacks.hub(spark)), ("stacks", lambda: for_stacks.stacks(spark)),
        ("disk", lambda: for_stacks.disk(spark)), ("daemon", lambda: on_host.daemon(facts)),
        ("port", lambda: on_host.port(spark, facts)),
        ("spark", lambda: gb10.logind(spark)), ("spark", lambda: gb10.driver(spark)),
        ("spark", lambda: gb10.usable_memory(spark)), ("spark", lambda: gb10.swap(spark)),
        ("spark", lambda: gb10.shm(spark)), ("spark", lambda: gb10.alloc_conf(spark)),
        ("sentinel", lambda: gb10.kernel_log(spark)),
        ("sentinel", lambda: gb10.last_words(spark, daemon_running=facts.holder is not None)),
    ], only=areas)


def _daemon(rt: Runtime) -> DaemonFacts:
    from sparkctl.cli.service import unit_paths
    from sparkctl.doctor.host import DaemonFacts

    client = rt.client
    holder = client.holder()
    return DaemonFacts(holder=holder, answers=holder is not None and client.available(), socket=client.path,
                       units=tuple(p for p in unit_paths(rt.settings.instance) if p.exists()))


def _print(rt: Runtime, report: Report) -> None:
    """One line a check: what was found, or what is wrong and what fixes it."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(show_header=False, box=None, pad_edge=False)
    for check in report.checks:
        table.add_row(STYLE[check.status], escape(check.name), escape(check.detail))
        if check.fix:  # a row of its own: run into the detail it read as more of the finding
            table.add_row("", "", f"[bold]fix:[/] {escape(check.fix)}")
    rt.console.print(table)
    failed = len(report.failed)
    rt.console.print(f"[red]{failed} check{'s' if failed > 1 else ''} failed[/]" if failed
                     else "[green]ready[/]: no check failed")
