"""`sparkctl image list | pin | unpin | blacklist | unblacklist | forget-wake | check`: the image
policy."""

from __future__ import annotations

import typer
from rich.table import Table

from sparkctl.cli.runtime import runtime
from sparkctl.errors import SparkctlError

app = typer.Typer(help="Pin image tags to digests and blacklist broken ones.", no_args_is_help=True)


@app.command("list")
def list_(ctx: typer.Context) -> None:
    """Show pins, the blacklist, and how each digest's first watched wake from sleep mode went."""
    rt = runtime(ctx)
    pins = Table("pinned ref", "digest", "known good", "provenance", "since", title="pins")
    for ref, pin in rt.policy.pins.items():
        pins.add_row(ref, pin.digest, "yes" if pin.known_good else "", pin.provenance, str(pin.pinned or ""))
    bans = Table("blacklisted ref or digest", "reason", "date", title="blacklist")
    for ref, ban in rt.policy.blacklist.items():
        bans.add_row(ref, ban.reason, str(ban.date or ""))
    wakes = Table("digest", "sleeps and wakes", "reason", "date", title="sleep mode")
    for digest, wake in rt.policy.wakes.items():
        wakes.add_row(digest, "yes" if wake.ok else "no: parks by stopping", wake.reason, str(wake.date or ""))
    rt.console.print(pins, bans, wakes)


@app.command()
def pin(
    ctx: typer.Context,
    ref: str,
    digest: str = typer.Option(None, "--digest", help="sha256:...; default: ask the registry."),
    provenance: str = typer.Option("pinned by hand", "--provenance", help="Why this digest is trusted."),
) -> None:
    """Pin REF's tag to a digest; `up` then runs exactly that digest."""
    from sparkctl.policy.images import check as check_ref
    from sparkctl.policy.images import parse_ref
    from sparkctl.spec import imagefile

    rt = runtime(ctx)
    name = parse_ref(ref)
    if digest is None:
        digest = rt.docker.registry_digest(str(name), mirrors=rt.settings.registry_mirrors)
    check_ref(rt.policy, ref, digest=digest, allow_latest=True)
    imagefile.pin(rt.settings.images_file, ref, digest=digest, provenance=provenance)
    rt.console.print(f"pinned {name.tagged} -> {digest}")


@app.command("forget-wake")
def forget_wake(ctx: typer.Context, digest: str) -> None:
    """Forget how DIGEST woke (e.g. after a fixed image or driver): its next wake is watched again."""
    from sparkctl.spec import imagefile

    rt = runtime(ctx)
    if not imagefile.forget_wake(rt.settings.images_file, digest):
        raise SparkctlError(f"{digest} has no wake record; `sparkctl image list` shows them")
    rt.console.print(f"forgot how {digest} woke")


@app.command()
def unpin(ctx: typer.Context, ref: str) -> None:
    """Remove REF's pin."""
    from sparkctl.spec import imagefile

    rt = runtime(ctx)
    if not imagefile.unpin(rt.settings.images_file, ref):
        raise SparkctlError(f"{ref} is not pinned; `sparkctl image list` shows the pins")
    rt.console.print(f"unpinned {ref}")


@app.command()
def blacklist(
    ctx: typer.Context,
    ref: str = typer.Argument(..., help="repo:tag, repo@sha256:..., or a bare sha256:... digest"),
    reason: str = typer.Option(..., "--reason", help="What is broken, for whoever meets the refusal."),
) -> None:
    """Refuse REF (or a digest) from now on, with the reason."""
    from sparkctl.spec import imagefile

    rt = runtime(ctx)
    imagefile.blacklist(rt.settings.images_file, ref, reason=reason)
    rt.console.print(f"blacklisted {ref}: {reason}")


@app.command()
def unblacklist(ctx: typer.Context, ref: str) -> None:
    """Allow REF again."""
    from sparkctl.spec import imagefile

    rt = runtime(ctx)
    if not imagefile.unblacklist(rt.settings.images_file, ref):
        raise SparkctlError(f"{ref} is not blacklisted; `sparkctl image list` shows the blacklist")
    rt.console.print(f"unblacklisted {ref}")


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
    rt.console.print(f"[green]allowed[/]: {ref}" + (f" (pinned to {pin.digest})" if pin else ""))
