"""`sparkctl route set | rm | show | suggest | apply`: aliases routed by prompt length, through the
daemon (its gateway counts each request's prompt tokens and sends it to the first rule that
holds them). `suggest` reads the latest benchmark runs of two stacks and proposes the threshold
at their measured crossover; `apply` sets it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from sparkctl.cli.console import OUTPUT, Column, Output, table, through_daemon
from sparkctl.cli.runtime import runtime
from sparkctl.errors import SparkctlError

if TYPE_CHECKING:
    from sparkctl.messages import RouteDone

app = typer.Typer(help="Route an alias's requests by their prompt length.", no_args_is_help=True)
ROUTES = (Column("alias", name=True), Column("rule", wide=True), Column("prompt tokens"), Column("stack", name=True))


@app.command("set")
def set_(ctx: typer.Context, alias: str = typer.Argument(..., help="The alias agents name, e.g. primary."),
         rules: list[str] = typer.Argument(..., metavar="STACK:TOKENS... STACK",
                                           help="In order: a stack and the most prompt tokens it takes "
                                                "(8192 or 8k), then the stack for the rest.")) -> None:
    """Route ALIAS by prompt length, e.g. `sparkctl route set primary qwen36-dflash:8k qwen36-nvfp4-aeon`.
    Every stack named must be up or parked; the alias stops being a plain one."""
    result = _route(ctx, alias, " ".join(rules))
    rt = runtime(ctx)
    for rule in result.rules or ():
        limit = f"up to {rule.up_to} tokens" if rule.up_to is not None else "the rest"
        rt.console.print(f"{escape(alias)}: {limit} -> {escape(rule.stack)}")
    rt.console.print(f"memory: the routed stacks hold {result.memory or 0:.2f} of this Spark together "
                     f"(ceiling {result.ceiling or 0:.2f}; stacks placed across the fleet not counted)")
    for line in result.fit:
        rt.console.print(escape(line))


@app.command("rm")
def rm(ctx: typer.Context, alias: str) -> None:
    """Stop routing ALIAS (it names nothing until `sparkctl switch ALIAS STACK`)."""
    _route(ctx, alias, "")
    runtime(ctx).console.print(f"{escape(alias)} is no longer routed")


@app.command("show")
def show(ctx: typer.Context, output: Output | None = OUTPUT) -> None:
    """Every routed alias and its rules, as the daemon has them."""
    from sparkctl import messages

    rt = runtime(ctx)
    routes = messages.load(messages.DesiredState, rt.daemon.get("/v1/desired")).routes
    rows = [(escape(alias) if index == 0 else "", str(index),
             f"<= {rule.up_to}" if rule.up_to is not None else "the rest", escape(rule.stack))
            for alias, rules in sorted(routes.items()) for index, rule in enumerate(rules)]
    rt.console.print(table(ROUTES, rows, output=output, title="routed aliases") if routes else "no alias is routed")


@app.command("suggest")
def suggest(ctx: typer.Context, fast: str = typer.Argument(..., help="The stack for short prompts (e.g. DFlash)."),
            rest: str = typer.Argument(..., help="The stack for the rest (e.g. its no-spec twin).")) -> None:
    """Propose where FAST should hand over to REST: the longest prompt FAST decoded faster, from
    the latest benchmark run of each (`sparkctl bench run`), with the numbers it used."""
    rt = runtime(ctx)
    threshold = _crossover(rt, fast, rest)
    rt.console.print(f"suggested: sparkctl route set ALIAS {fast}:{threshold} {rest}")


@app.command("apply")
def apply(ctx: typer.Context, alias: str, fast: str, rest: str) -> None:
    """Route ALIAS at the threshold `suggest FAST REST` proposes."""
    rt = runtime(ctx)
    threshold = _crossover(rt, fast, rest)
    _route(ctx, alias, f"{fast}:{threshold} {rest}")
    rt.console.print(f"{escape(alias)}: up to {threshold} tokens -> {escape(fast)}, the rest -> {escape(rest)}")


def _crossover(rt, fast: str, rest: str) -> int:  # noqa: ANN001 - the CLI's Runtime
    """The prompt length at which FAST hands over to REST, after printing the numbers it used."""
    from sparkctl.bench.profiles import PROFILES
    from sparkctl.report.analysis import crossover

    runs = {}
    for stack in (fast, rest):
        run = next((r for r in rt.store.bench.runs(rt.catalog.stack(stack).name) if r.rows and not r.error), None)
        if run is None:
            raise SparkctlError(f"{stack} has no finished benchmark run: `sparkctl bench run {stack} --profile seed` "
                                "measures decode across context depths")
        runs[stack] = run
    decode = {s: {row["depth"]: row["tg_tps"] for row in run.rows if row["concurrency"] == 1 and not row["failed"]}
              for s, run in runs.items()}
    ratio = {d: decode[fast][d] / decode[rest][d] for d in sorted(decode[fast]) if decode[rest].get(d)}
    if not ratio:
        raise SparkctlError(f"the latest runs of {fast} and {rest} share no context depth; run both with one profile")
    found = crossover(ratio)
    lines = [f"run {runs[fast].id} ({fast}) vs run {runs[rest].id} ({rest}), decode tok/s at concurrency 1:"]
    lines += [f"  depth {d}: {decode[fast][d]:.1f} vs {decode[rest][d]:.1f} ({r:.2f}x)" for d, r in ratio.items()]
    if found is None:
        faster = all(r >= 1 for r in ratio.values())
        raise SparkctlError("\n".join(lines) + f"\n{fast} is {'faster' if faster else 'not faster'} at every depth "
                            "measured, so there is no crossover to route at; use a plain alias")
    before, after = found
    pp = PROFILES[runs[fast].profile].pp if runs[fast].profile in PROFILES else 0
    lines.append(f"{fast} is faster through depth {before} and slower from {after} on; its deepest faster test "
                 f"sent {before} + {pp} prompt tokens")
    rt.console.print("\n".join(lines))
    return before + pp


def _route(ctx: typer.Context, alias: str, rules: str) -> RouteDone:
    from sparkctl import messages

    rt = runtime(ctx)
    return through_daemon(rt.daemon, "/v1/route", messages.RouteRequest(alias, rules), messages.RouteDone)
