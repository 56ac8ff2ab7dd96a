"""`sparkctl bench run | list | report | sweep | agent`: benchmark running stacks with llama-benchy,
judge them with the regression gate, write comparison reports, and replay agent sessions
through the gateway."""

from __future__ import annotations

import typer
from rich.table import Table

from sparkctl.cli.console import OUTPUT, Column, Output, table
from sparkctl.cli.runtime import runtime
from sparkctl.errors import SparkctlError
from sparkctl.messages import BenchDone, BenchRequest

app = typer.Typer(help="Benchmark stacks (llama-benchy) and report.", no_args_is_help=True)

PROFILE_HELP = ("quick | seed | concurrency (default: the stack's bench_profile) | quality (the stack's "
                "expectations.quality task with lm-eval, judged by its quality gate).")
TEMPERATURE_HELP = "Sample at this temperature (e.g. 1.0 for DFlash's sampled gains); default: the engine's."
COHERENCE_HELP = "Skip llama-benchy's coherence check (for random weights or the simulated engine)."
RUNS = (Column("run"), Column("stack", name=True), Column("profile"), Column("fingerprint", wide=True),
        Column("depth 0 tok/s"), Column("verdict"))


@app.command("run")
def run(
    ctx: typer.Context,
    stack: str,
    profile: str = typer.Option("", "--profile", "-p", help=PROFILE_HELP),
    depths: str = typer.Option("", "--depths", help="Override the profile's depths: 0,4096,8192."),
    runs: int | None = typer.Option(None, "--runs", help="Override the profile's runs per depth."),
    temperature: float | None = typer.Option(None, "--temperature", min=0.0, help=TEMPERATURE_HELP),
    skip_coherence: bool = typer.Option(False, "--skip-coherence", help=COHERENCE_HELP),
) -> None:
    """Benchmark the running STACK, store the run with its fingerprint, judge it with its gate
    (in the daemon: Ctrl-C cancels it there). `-p quality` measures its accuracy instead."""
    rt = runtime(ctx)
    done = _measure(rt, BenchRequest(stack, profile, depths, runs, temperature, skip_coherence))
    colour = "green" if done.passed else "red"
    run_of = f"quality run {done.run}" if done.quality else f"run {done.run} ({done.profile})"
    rt.console.print(f"{run_of} of {stack}: [{colour}]{done.verdict}[/]; raw files in {done.folder}")


@app.command("list")
def list_runs(ctx: typer.Context, stack: str | None = typer.Argument(None), output: Output | None = OUTPUT) -> None:
    """Stored benchmark runs, newest first."""
    rows = []
    for r in runtime(ctx).store.bench.runs(stack):
        decode = next((row["tg_tps"] for row in r.rows if row["depth"] == 0 and row["concurrency"] == 1), None)
        rows.append((str(r.id), r.stack, r.profile, (r.fingerprint or "")[:12],
                     f"{decode:.1f}" if decode is not None else "", r.error or r.verdict or ""))
    runtime(ctx).console.print(table(RUNS, rows, output=output))


def _measure(rt, ask: BenchRequest) -> BenchDone:  # noqa: ANN001 - the CLI's Runtime
    """The daemon benchmarks the running stack, stores the run and judges it; its rows shown here."""
    from sparkctl.cli.console import through_daemon

    done = through_daemon(rt.daemon, "/v1/bench", ask, BenchDone)
    if done.quality:  # `-p quality`: one accuracy, no llama-benchy rows
        rt.console.print(f"{done.stack}: {done.quality}", markup=False)
        return done
    table = Table("depth", "conc", "prefill tok/s", "decode tok/s", "TTFT ms", "acceptance", "accept len",
                  title=f"{done.stack} — run {done.run}")
    for r in done.rows:
        table.add_row(str(r["depth"]), str(r["concurrency"]), f"{r['pp_tps']:.0f}", f"{r['tg_tps']:.1f}",
                      f"{r['ttft_ms']:.0f}", _num(r.get("acceptance")), _num(r.get("acceptance_length")),
                      style="red" if r.get("failed") else None)
    rt.console.print(table)
    return done


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


@app.command("report")
def report_cmd(
    ctx: typer.Context,
    targets: list[str] | None = typer.Argument(None, metavar="[RUN|STACK...]",
                                               help="Run ids, or stacks (globs) for their latest run."),
    out: str | None = typer.Option(None, "--out", "-o", help="Folder (default: STATE_DIR/reports/<time>)."),
    label: str = typer.Option("", "--label", help="A line under the title (e.g. where it was measured)."),
) -> None:
    """Write comparison.md (headline, environment, tables, caveats), graphs/, results/ (raw
    llama-benchy JSON) and dataset.csv/json comparing benchmark runs."""
    from sparkctl.deploy.retest import reported_spec

    rt = runtime(ctx)
    entries = [(reported_spec(rt.catalog, run.stack), run) for run in _runs(rt, targets or [])]  # retests too
    path = _write_report(rt, entries, out, label=label)
    rt.console.print(f"report of {len(entries)} config(s): {path}")


@app.command("agent")
def agent_cmd(
    ctx: typer.Context,
    targets: list[str] = typer.Argument(..., help="Stacks or aliases (routed ones too), one session each, in turn."),
    session: str = typer.Option("long", "--session", "-s", help="short | long | a shape file (YAML)."),
) -> None:
    """Replay an agent session through the gateway against each TARGET, one call at a time with
    the openai client, and report seconds per session, the wait per call and a graph of it."""
    import time

    import openai

    from sparkctl import messages
    from sparkctl.adapters import hub
    from sparkctl.bench import agent, corpus
    from sparkctl.gateway import tokens
    from sparkctl.report import agent as agent_report

    rt = runtime(ctx)
    spec, settings = agent.shape(session), rt.settings
    routes = messages.load(messages.DesiredState, rt.daemon.get("/v1/desired")).routes
    stacks: dict[str, list[str]] = {}  # target -> the stacks that may answer it
    for target in targets:
        if target not in routes and target not in rt.catalog.stacks:
            raise SparkctlError(f"{target}: neither a stack nor a routed alias (for a plain alias, name its stack)")
        stacks[target] = [r.stack for r in routes[target]] if target in routes else [target]
    first = rt.catalog.stack(stacks[targets[0]][0])
    if first.model is None or first.model.repo is None:
        raise SparkctlError(f"{first.name} names no model repo: its tokenizer sizes the session's text")
    tokenizer = tokens.load(hub.cached_snapshot(settings.hf_cache_dir, first.model.repo, first.model.revision))
    fill = agent.Filler(tokenizer.tokenizer, corpus.text())
    keys = settings.gateway_api_keys
    client = openai.OpenAI(base_url=f"{settings.gateway_url}/v1", max_retries=0, timeout=3600,
                           api_key=keys[0].get_secret_value() if keys else "unused")
    done = []
    for target in targets:
        engines = {s: rt.catalog.stack(s).url for s in stacks[target]}
        rt.console.print(f"{target}: {spec.name} session, {len(spec.calls())} calls")
        session_run = agent.run(client, target, spec, fill, engines=engines, on_call=lambda c: rt.console.print(
            f"  call {c.index + 1}: {c.context} tokens -> {c.stack}, ttft {c.ttft_s:.2f} s, total {c.total_s:.2f} s"))
        done.append(session_run.to_dict())
    folder = settings.state_dir / "bench" / f"agent-{time.strftime('%Y%m%d-%H%M%S')}"
    agent.save(folder, done)
    limits = {t: [r.up_to for r in routes[t] if r.up_to is not None] for t in targets if t in routes}
    graph = agent_report.draw(done, folder, thresholds=limits)
    (folder / "agent.md").write_text("## Seconds per agent session\n\n" + agent_report.table(done)
                                     + f"\n![wait per call against context]({graph})\n")
    rt.console.print(agent_report.table(done))
    rt.console.print(f"written: {folder / 'agent.md'}")


@app.command("sweep")
def sweep(
    ctx: typer.Context,
    stacks: list[str] = typer.Argument(..., metavar="STACK...", help="Stacks or globs (e.g. 'qwen36-*')."),
    profile: str = typer.Option("seed", "--profile", "-p", help=PROFILE_HELP.replace("the stack's bench_profile",
                                                                                       "seed")),
    depths: str = typer.Option("", "--depths", help="Override the profile's depths: 0,4096,8192."),
    runs: int | None = typer.Option(None, "--runs", help="Override the profile's runs per depth."),
    temperature: float | None = typer.Option(None, "--temperature", min=0.0, help=TEMPERATURE_HELP),
    skip_coherence: bool = typer.Option(False, "--skip-coherence", help=COHERENCE_HELP),
    out: str | None = typer.Option(None, "--out", "-o", help="Folder for the comparison report."),
    label: str = typer.Option("", "--label", help="A line under the report's title."),
) -> None:
    """Deploy each stack in turn (stopping what is in the way), benchmark it, take it down, and
    write one comparison report: seed 000's study, repeatable."""
    from sparkctl.bench.profiles import choose
    from sparkctl.cli.console import through_daemon
    from sparkctl.messages import DownDone, DownRequest, UpDone, UpRequest

    rt = runtime(ctx)
    choose(profile, depths=depths, runs=runs, temperature=temperature)  # a wrong one is said before any deploy
    entries = []
    for name in _expand(rt, stacks):
        spec = rt.catalog.stack(name)
        rt.console.rule(f"{name}")
        through_daemon(rt.daemon, "/v1/up", UpRequest(name, replace=True), UpDone)
        try:
            done = _measure(rt, BenchRequest(name, profile, depths, runs, temperature, skip_coherence))
            rt.console.print(f"run {done.run}: {done.verdict}")
            entries.append((spec, rt.store.bench.run(done.run)))
        finally:
            through_daemon(rt.daemon, "/v1/down", DownRequest(name), DownDone)
    path = _write_report(rt, entries, out, label=label)
    rt.console.print(f"[green]sweep of {len(entries)} config(s) done[/]: {path}")


def _runs(rt, targets: list[str]) -> list:
    if not targets:
        latest = {}
        for run in rt.store.bench.runs(limit=1000):
            if run.rows and run.stack not in latest:
                latest[run.stack] = run
        return sorted(latest.values(), key=lambda r: r.id)
    found = []
    for target in targets:
        if target.isdigit():
            run = rt.store.bench.run(int(target))
            if run is None:
                raise SparkctlError(f"no benchmark run {target}; `sparkctl bench list` shows them")
            found.append(run)
            continue
        for name in _expand(rt, [target]):
            run = next((r for r in rt.store.bench.runs(name) if r.rows), None)
            if run is None:
                raise SparkctlError(f"{name} has no benchmark run yet: `sparkctl bench run {name}`")
            found.append(run)
    return found


def _expand(rt, patterns: list[str]) -> list[str]:
    from fnmatch import fnmatch

    names = []
    for pattern in patterns:
        matched = [s.name for s in rt.catalog.deployable() if fnmatch(s.name, pattern)]
        if not matched:
            rt.catalog.stack(pattern)  # raises naming the known stacks
        names += [n for n in matched if n not in names]
    return names


def _write_report(rt, entries: list, out: str | None, *, label: str):
    from pathlib import Path

    from sparkctl import report

    return report.compare(entries, rt.settings, rt.store, label=label, folder=Path(out) if out else None)
