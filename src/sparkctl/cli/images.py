"""`sparkctl image list | pin | unpin | blacklist | unblacklist | retest | forget-wake | check`: the
image policy, and re-qualifying a blacklisted tag by measuring it again."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from rich.table import Table

from sparkctl.cli.console import OUTPUT, Column, Output, table
from sparkctl.cli.runtime import runtime
from sparkctl.errors import SparkctlError

if TYPE_CHECKING:
    from sparkctl.messages import ImageEdited, RetestDone
    from sparkctl.policy.images import Ban

app = typer.Typer(help="Pin image tags to digests and blacklist broken ones.", no_args_is_help=True)


UNSETTLED = "(none yet: the first `up` records it)"  # a known-good tag whose digest was never published
PINS = (Column("pinned ref"), Column("digest", wide=True), Column("known good"), Column("provenance", wide=True),
        Column("since"), Column("layer"))
BANS = (Column("blacklisted ref or digest"), Column("reason"), Column("date", wide=True), Column("last retest"),
        Column("layer"))
WAKES = (Column("digest"), Column("sleeps and wakes"), Column("reason", wide=True), Column("date", wide=True),
         Column("layer"))
LIFTS = (Column("section"), Column("ref or digest"), Column("lifted from"))


@app.command("list")
def list_(ctx: typer.Context, output: Output | None = OUTPUT) -> None:
    """Show pins, the blacklist, and how each digest's first watched wake from sleep mode went, each
    entry with its layer (shipped, the owner's images.yaml, or recorded in the state); then the
    shipped or owner's entries the state lifted."""
    rt = runtime(ctx)
    layered = rt.store.images.layered()
    policy = layered.policy

    def layer(section: str, key: str) -> str:
        below = layered.hidden.get((section, key))
        return str(layered.origin[(section, key)]) + (f", over {below}" if below else "")

    pins = [(ref, pin.digest or UNSETTLED, "yes" if pin.known_good else
             (f"not yet: first seen {pin.first_seen}, until a benchmark passes" if pin.first_seen else ""),
             pin.provenance, str(pin.pinned or ""), layer("pins", ref)) for ref, pin in policy.pins.items()]
    bans = [(ref, ban.reason, str(ban.date or ""), _last_retest(ban), layer("blacklist", ref))
            for ref, ban in policy.blacklist.items()]
    wakes = [(digest, "yes" if wake.ok else "no: parks by stopping", wake.reason, str(wake.date or ""),
              layer("wakes", digest)) for digest, wake in policy.wakes.items()]
    rt.console.print(
        table(PINS, pins, output=output, title="pins"), table(BANS, bans, output=output, title="blacklist"),
        table(WAKES, wakes, output=output, title="sleep mode"))
    lifted = [(section, key, str(below)) for section, key, below in layered.lifted()]
    if lifted:
        rt.console.print(table(LIFTS, lifted, output=output, title="removed by the owner (recorded in the state)"))


def _last_retest(ban: Ban) -> str:
    last = ban.retests[-1] if ban.retests else None
    return f"{last.date} {last.digest[:19]}: {last.verdict} ({len(ban.retests)} in all)" if last else ""


@app.command()
def pin(
    ctx: typer.Context,
    ref: str,
    digest: str = typer.Option("", "--digest", help="sha256:...; default: ask the registry."),
    provenance: str = typer.Option("pinned by hand", "--provenance", help="Why this digest is trusted."),
) -> None:
    """Pin REF's tag to a digest; `up` then runs exactly that digest."""
    pinned = _edit(ctx, "pin", ref, digest=digest, provenance=provenance)
    runtime(ctx).console.print(f"pinned {pinned.ref} -> {pinned.digest}")


@app.command("forget-wake")
def forget_wake(ctx: typer.Context, digest: str) -> None:
    """Forget how DIGEST woke (e.g. after a fixed image or driver): its next wake is watched again."""
    _edit(ctx, "forget-wake", digest)
    runtime(ctx).console.print(f"forgot how {digest} woke")


@app.command()
def unpin(ctx: typer.Context, ref: str) -> None:
    """Remove REF's pin (one sparkctl ships, or the owner's images.yaml holds, is lifted in the state)."""
    _edit(ctx, "unpin", ref)
    runtime(ctx).console.print(f"unpinned {ref}")


@app.command()
def blacklist(
    ctx: typer.Context,
    ref: str = typer.Argument(..., help="repo:tag, repo@sha256:..., or a bare sha256:... digest"),
    reason: str = typer.Option(..., "--reason", help="What is broken, for whoever meets the refusal."),
    digest: str = typer.Option("", "--digest", help="For a tag: the digest it names now, so `image retest` "
                                                    "can tell when the tag has moved."),
) -> None:
    """Refuse REF (or a digest) from now on, with the reason."""
    _edit(ctx, "blacklist", ref, reason=reason, digest=digest)
    runtime(ctx).console.print(f"blacklisted {ref}: {reason}")


@app.command()
def unblacklist(ctx: typer.Context, ref: str) -> None:
    """Allow REF again (a ban sparkctl ships, or the owner's images.yaml holds, is lifted in the state)."""
    _edit(ctx, "unblacklist", ref)
    runtime(ctx).console.print(f"unblacklisted {ref}")


def _edit(ctx: typer.Context, edit: str, ref: str, **fields: str) -> ImageEdited:
    """The edit made by the daemon, which owns images.yaml (it edits it too: retests, wakes, pins)."""
    from dataclasses import asdict

    from sparkctl import messages

    done = messages.load(messages.Done, runtime(ctx).daemon.post("/v1/image",
                                                                 asdict(messages.ImageEdit(edit, ref, **fields))))
    if not isinstance(done, messages.ImageEdited):
        raise SparkctlError(f"the daemon answered /v1/image with {type(done).__name__}: restart the daemon so that "
                            "it runs this sparkctl")
    return done


@app.command()
def check(
    ctx: typer.Context,
    ref: str,
    digest: str = typer.Option(None, "--digest", help="Also check this resolved digest."),
    allow_latest: bool = typer.Option(False, "--allow-latest", help="Accept a moving tag."),
) -> None:
    """Say whether the policy lets REF run (exit 1 with the reason if not)."""
    from sparkctl.policy.images import check as check_ref

    rt = runtime(ctx)
    check_ref(rt.policy, ref, digest=digest, allow_latest=allow_latest)
    pin = rt.policy.pin_for(ref)
    rt.console.print(f"[green]allowed[/]: {ref}" + (f" (pinned to {pin.digest or UNSETTLED})" if pin else ""))


@app.command()
def retest(
    ctx: typer.Context,
    ref: str = typer.Argument(..., help="The blacklisted tag (repo:tag)."),
    stack: str = typer.Option(None, "--stack", help="The stack whose model, flags and gate measure it "
                                                   "(default: the one that runs the tag's repository)."),
    force: bool = typer.Option(False, "--force", help="Measure even a digest that is unchanged since the ban "
                                                      "or blacklisted itself."),
) -> None:
    """Measure what the blacklisted tag REF names on its registry now: deployed alone as a trial of
    its stack (not desired, in no alias, removed afterwards) and judged by the stack's gate. A pass
    lifts the ban and pins the digest as known-good; a failure keeps the ban, with the measurement."""
    from sparkctl import messages
    from sparkctl.cli.console import through_daemon

    rt = runtime(ctx)
    asked = messages.RetestRequest(ref, stack or "", force)
    result = through_daemon(rt.daemon, "/v1/retest", asked, messages.RetestDone)
    _show_retest(rt, result)


def _show_retest(rt, result: RetestDone) -> None:  # noqa: ANN001 - the CLI's Runtime
    """The measured rows, then one line: re-qualified, or still broken (exit 1)."""
    if result.rows:
        table = Table("depth", "concurrency", "decode tok/s", "acceptance", "failed",
                      title=f"{result.ref} @ {result.digest[:19]} with {result.stack} — run {result.run}")
        for r in result.rows:
            acceptance = "" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
            table.add_row(str(r["depth"]), str(r["concurrency"]), f"{r['tg_tps']:.1f}", acceptance,
                          "yes" if r["failed"] else "", style="red" if r["failed"] else None)
        rt.console.print(table)
    if result.quality:
        rt.console.print(f"quality run {result.quality_run}: {result.quality}", markup=False)
    if result.passed:
        rt.console.print(f"[green]{result.ref} re-qualified[/]: {result.digest} passed {result.stack}'s gate "
                         f"in benchmark run {result.run}; lifted {', '.join(result.lifted)} and pinned the tag "
                         "to that digest as known-good")
        return
    kept = ("the ban stays, with this measurement added to it" if result.recorded
            else "the ban was lifted by hand meanwhile, so the measurement was not recorded")
    raise SparkctlError(f"{result.ref} at {result.digest} still fails {result.stack}'s gate: "
                        f"{result.verdict.removeprefix('fail: ')}; {kept}")
