"""`sparkctl bench run | list | report | sweep`: benchmark running stacks with llama-benchy, judge
them with the regression gate, and write comparison reports."""

from __future__ import annotations

import typer
from rich.live import Live
from rich.table import Table

from sparkctl.cli.runtime import runtime
from sparkctl.errors import SparkctlError

app = typer.Typer(help="Benchmark stacks (llama-benchy) and report.", no_args_is_help=True)

PROFILE_HELP = "quick | seed | concurrency (default: the stack's bench_profile)."


@app.command("run")
def run(
    ctx: typer.Context,
    stack: str,
    profile: str | None = typer.Option(None, "--profile", "-p", help=PROFILE_HELP),
    depth: list[int] | None = typer.Option(None, "--depth", help="Override the profile's depths."),
    runs: int | None = typer.Option(None, "--runs", help="Override the profile's runs per depth."),
) -> None:
    """Benchmark the running STACK, store the run with its fingerprint, judge it with its gate."""
    from sparkctl.bench import stack as bench_stack

    rt = runtime(ctx)
    spec = rt.catalog.stack(stack)
    chosen = _profile(profile or spec.bench_profile, depth, runs)
    with Live(_progress_table(None), console=rt.console, transient=True) as live:
        result = bench_stack.benchmark(spec, settings=rt.settings, store=rt.store, profile=chosen,
                                       on_progress=lambda p: live.update(_progress_table(p)))
    verdict = bench_stack.gate(spec, result, settings=rt.settings, store=rt.store)
    rt.console.print(_rows_table(result))
    colour = "green" if verdict.passed else "red"
    rt.console.print(f"run {result.id} ({chosen.name}) of {stack}: [{colour}]{verdict.describe()}[/]; "
                     f"raw files in {result.folder}")


@app.command("list")
def list_runs(ctx: typer.Context, stack: str | None = typer.Argument(None)) -> None:
    """Stored benchmark runs, newest first."""
    rt = runtime(ctx)
    table = Table("run", "stack", "profile", "fingerprint", "depth 0 tok/s", "verdict")
    for r in rt.store.bench_runs(stack):
        decode = next((row["tg_tps"] for row in r.rows if row["depth"] == 0 and row["concurrency"] == 1), None)
        table.add_row(str(r.id), r.stack, r.profile, (r.fingerprint or "")[:12],
                      f"{decode:.1f}" if decode is not None else "", r.error or r.verdict or "")
    rt.console.print(table)


def _profile(name: str, depth: list[int] | None, runs: int | None):
    from dataclasses import replace

    from sparkctl.bench.profiles import PROFILES

    if name not in PROFILES:
        raise SparkctlError(f"no benchmark profile {name!r}; choose one of {', '.join(PROFILES)}")
    chosen = PROFILES[name]
    if depth:
        chosen = replace(chosen, depths=tuple(depth))
    return replace(chosen, runs=runs) if runs else chosen


def _progress_table(progress) -> Table:
    table = Table("depth", "concurrency", "requests done", "decode tok/s so far", box=None)
    if progress is not None:
        rate = f"{sum(progress.tok_s) / len(progress.tok_s):.1f}" if progress.tok_s else "…"
        table.add_row(str(progress.depth), str(progress.concurrency), f"{progress.done}/{progress.total}", rate)
    return table


def _rows_table(result) -> Table:
    table = Table("depth", "conc", "prefill tok/s", "decode tok/s", "TTFT ms", "acceptance", "accept len",
                  title=f"{result.stack} — run {result.id}")
    for r in result.rows:
        table.add_row(str(r["depth"]), str(r["concurrency"]), f"{r['pp_tps']:.0f}", f"{r['tg_tps']:.1f}",
                      f"{r['ttft_ms']:.0f}", _num(r.get("acceptance")), _num(r.get("acceptance_length")),
                      style="red" if r.get("failed") else None)
    return table


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"
