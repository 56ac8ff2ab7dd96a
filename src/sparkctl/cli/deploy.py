"""`sparkctl up | down | switch | park | wake | status | logs` and `sparkctl patch check`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from sparkctl.cli import views
from sparkctl.cli.console import OUTPUT, Output, say, through_daemon
from sparkctl.cli.runtime import runtime
from sparkctl.errors import SparkctlError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

patch_app = typer.Typer(help="Check a stack's patches against its image.", no_args_is_help=True)


def up(
    ctx: typer.Context,
    stack: str,
    refresh: bool = typer.Option(False, "--refresh", help="Follow the tag if it moved since it was pinned."),
    replace: bool = typer.Option(False, "--replace", help="Stop the stacks in the way if memory is short."),
) -> None:
    """Bring STACK up: image by digest, weights, patches, container, health checks."""
    views.up(runtime(ctx).daemon, stack, refresh=refresh, replace=replace)


def pull(
    ctx: typer.Context,
    stacks: list[str] = typer.Argument(..., metavar="STACK...", help="The stacks to fetch."),
    refresh: bool = typer.Option(False, "--refresh", help="Follow a tag if it moved since it was pinned."),
) -> None:
    """Fetch each STACK's image, weights and draft, and patch, starting nothing: a later `up` or
    `switch` waits only for the engine. Shown as `fetched` in `status`."""
    from sparkctl import messages

    rt = runtime(ctx)
    for stack in stacks:
        done = through_daemon(rt.daemon, "/v1/pull", messages.PullRequest(stack, refresh), messages.PullDone)
        rt.console.print(f"{stack} fetched (fingerprint {done.fingerprint}); `sparkctl up {stack}` starts it")


def down(ctx: typer.Context, stack: str) -> None:
    """Stop and remove STACK's containers; state, pins and downloads are kept."""
    from sparkctl import messages

    rt = runtime(ctx)
    removed = through_daemon(rt.daemon, "/v1/down", messages.DownRequest(stack), messages.DownDone).removed
    rt.console.print(f"{stack}: {'removed ' + str(removed) + ' container(s)' if removed else 'was not running'}")


def switch(
    ctx: typer.Context,
    names: list[str] = typer.Argument(..., metavar="[ALIAS] STACK", help="Alias (default primary), then stack."),
) -> None:
    """Point ALIAS (default `primary`) at STACK without failing the agent: blue/green when both fit in
    memory, else hold/swap (the gateway holds the alias's requests meanwhile). The old stack is
    parked (vLLM sleep mode) where it can be, a parked STACK woken. Rolled back on failure."""
    if len(names) > 2:
        raise SparkctlError(f"switch takes [ALIAS] STACK, got {' '.join(names)}")
    alias, stack = names if len(names) == 2 else ("primary", names[0])
    rt = runtime(ctx)
    from sparkctl import messages

    result = through_daemon(rt.daemon, "/v1/switch", messages.SwitchRequest(stack, alias), messages.SwitchDone)
    if result.up is not None:
        verb = "already up, unchanged" if result.up.unchanged else "started again"
        rt.console.print(f"[green]{alias} already names {stack}[/]: nothing to switch ({stack} {verb})")
        return
    timings = ", ".join(f"{k.removesuffix('_s')} {v:.2f} s" for k, v in result.timings.items())
    rt.console.print(f"[green]{alias} -> {stack}[/] ({result.mode}; {timings})")
    rt.console.print(f"plan: {result.why}")
    if result.held_requests:
        rt.console.print(f"{result.held_requests} request(s) were held and then served by {stack}")
    if bench := result.bench:
        rt.console.print(f"switch-over benchmark: {bench.get('summary') or bench.get('error')}")


def park(
    ctx: typer.Context,
    stack: str,
    how: str = typer.Option("auto", "--how", help="sleep1, sleep2, stop, or auto: the deepest-keeping level "
                                                   "whose memory peaks fit under the ceiling."),
) -> None:
    """Put STACK to sleep (vLLM sleep mode; its process, graphs and compiled kernels stay) or stop it.
    Its requests finish first; a later request that names it (or its alias) wakes it."""
    from sparkctl import messages

    result = through_daemon(runtime(ctx).daemon, "/v1/park", messages.ParkRequest(stack, how), messages.ParkDone)
    runtime(ctx).console.print(f"{stack}: {result.why}" if result.park != "unchanged" else f"{stack} is parked already")


def wake(ctx: typer.Context, stack: str) -> None:
    """Wake a parked STACK (under the wake watchdog) and warm it up with one token."""
    from sparkctl import messages

    result = through_daemon(runtime(ctx).daemon, "/v1/wake", messages.WakeRequest(stack), messages.WakeDone)
    how = f"from level {result.level}" if result.level else "cold (it was parked stopped)"
    killed = f"; [yellow]{result.killed}[/]" if result.killed else ""
    runtime(ctx).console.print(f"[green]{stack} is awake[/] ({how}, {result.seconds:.2f} s{killed})")


def status(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON."),
           output: Output | None = OUTPUT) -> None:
    """Every sparkctl container: stack, phase, endpoint, fingerprint, uptime, memory; below, how
    many full-context requests each engine's KV cache holds, and what falls short; and the last
    words of a daemon run that did not stop cleanly (a host that froze)."""
    from sparkctl import messages
    from sparkctl.state import lastwords

    rt = runtime(ctx)
    views.status(messages.load(messages.Status, rt.daemon.get("/v1/status")), as_json=as_json, output=output)
    ending = lastwords.previous(rt.settings.state_dir, daemon_running=True)  # the daemon just answered
    if ending is not None and not as_json:
        say("warning", "yellow", rest=f" {ending.summary()}")


def logs(
    ctx: typer.Context,
    stack: str,
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines."),
    tail: int = typer.Option(100, "--tail", "-n", help="Lines from the end."),
) -> None:
    """Print STACK's engine log."""
    rt = runtime(ctx)
    containers = rt.docker.containers(stack)
    if not containers:
        raise SparkctlError(f"{stack} has no container; `sparkctl status` lists what runs")
    name = containers[0].id
    if follow:
        import asyncio  # here: the other commands start faster without it

        asyncio.run(_print_all(rt.docker.follow_logs(name, tail=tail)))
    else:
        print(rt.docker.logs(name, tail=tail), end="")


async def _print_all(chunks: AsyncIterator[bytes]) -> None:
    async for chunk in chunks:
        print(chunk.decode(errors="replace"), end="", flush=True)


@patch_app.command("check")
def patch_check(ctx: typer.Context, stack: str) -> None:
    """Apply STACK's patch sets to its image's files without starting anything; print the diff.
    The daemon fetches what they need (Ctrl-C cancels it there, as for `up`)."""
    from sparkctl import messages

    rt = runtime(ctx)
    checked = through_daemon(rt.daemon, "/v1/patch-check", messages.PatchCheckRequest(stack), messages.PatchChecked)
    if not checked.files:
        rt.console.print(f"{stack} has no patch sets")
        return
    print(checked.diff, end="")
    rt.console.print(f"[green]patches apply[/]: {checked.files} files, patch-set hash {checked.hash}, "
                     f"vLLM at {checked.vllm_dir}")
