"""`sparkctl stacks list | show | validate | render`: read-only views of the stack files."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from sparkctl.cli import views
from sparkctl.cli.console import OUTPUT, Output
from sparkctl.cli.runtime import Runtime, runtime
from sparkctl.errors import ImageRefused, SparkctlError, SpecError

if TYPE_CHECKING:  # the spec layer is imported when a command runs, not when the CLI starts
    from sparkctl.spec.engine import Weights
    from sparkctl.spec.load import Catalog
    from sparkctl.spec.models import KnownIssue, Stack
    from sparkctl.spec.ranks import Rank

app = typer.Typer(help="List, show, validate and render stacks.", no_args_is_help=True)


class Format(StrEnum):
    DOCKER_RUN = "docker-run"
    COMPOSE = "compose"
    JSON = "json"


@app.command("list")
def list_(ctx: typer.Context, output: Output | None = OUTPUT) -> None:
    """One row per deployable stack, with what the image policy says of it."""
    from sparkctl import messages

    rows = runtime(ctx).daemon.get("/v1/stacks")["stacks"]
    views.stacks(tuple(messages.StackRow(**row) for row in rows), output=output)


@app.command()
def show(ctx: typer.Context, name: str) -> None:
    """Print a stack as resolved (after `extends`), with its spec hash; then what the gateway does
    with it: each known issue's source and whether its cap is enforced, and the request defaults."""
    from ruamel.yaml import YAML

    from sparkctl.spec.render import spec_hash

    rt = runtime(ctx)
    stack = rt.catalog.stack(name)
    data = stack.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    rt.console.print(f"# {rt.catalog.files[name]}  spec-hash {spec_hash(stack)}")
    YAML().dump(data, rt.console.file)
    for line in [*_gateway_lines(stack), _memory_line(stack)]:
        rt.console.print(f"# {line}", markup=False)


@app.command()
def validate(
    ctx: typer.Context,
    paths: list[Path] = typer.Argument(None, help="Stack files to check (default: the stacks dir)."),
) -> None:
    """Load and check stacks: schema, `extends`, patch sets and the image policy."""
    from sparkctl.policy.images import check

    rt = runtime(ctx)
    catalog = _catalog_with(rt, paths or [])
    wanted = {p.resolve() for p in paths or []}
    _refuse_invalid(rt, catalog, wanted)
    checked = [s for s in catalog.deployable() if not wanted or catalog.files[s.name].resolve() in wanted]
    for stack in checked:
        try:
            check(rt.policy, stack.image.ref, allow_latest=stack.image.allow_latest)
        except ImageRefused as e:
            raise SpecError(str(catalog.files[stack.name]), "image", str(e)) from None
        for why in [why for _, why in stack.risks()] + stack.advice():  # risks opted into with `allow:`, too
            rt.console.print(f"[yellow]warning[/]: {escape(stack.name)}: {escape(why)}")
    rt.console.print(f"[green]ok[/]: {len(checked)} stacks valid")


@app.command("render")
def render_(
    ctx: typer.Context,
    name: str,
    fmt: Format = typer.Option(Format.DOCKER_RUN, "--format", "-f", help="Output format."),
    rank: int | None = typer.Option(None, "--rank", min=0, help="A multi-node stack's rank: its container, with "
                                                                 "its host's network settings."),
) -> None:
    """Print the container a vLLM stack runs as: weights at their HF cache paths, and each file
    its patch sets change mounted over vLLM's (paths only the image can tell are placeholders).
    A multi-node stack's ranks run on the hosts its placement recorded, else (a preview) on the
    fleet file's hosts in order."""
    from ruamel.yaml import YAML

    from sparkctl.deploy.memory import GIB, folder_bytes, kv_plan, usable_memory
    from sparkctl.fleet.hostagent import placeable
    from sparkctl.policy.parking import sleep_refusal
    from sparkctl.spec.models import Kind
    from sparkctl.spec.render import Sources, additions, render

    rt = runtime(ctx)
    stack = rt.catalog.stack(name)
    if stack.kind is Kind.COMPOSE:
        raise SpecError(str(rt.catalog.files[name]), "kind",
                        f"a compose stack runs {rt.settings.compose_dir / stack.compose.project}; nothing to render")
    sources = Sources(
        model_dir=_cache_path(rt, stack.model),
        draft_dir=_cache_path(rt, stack.draft) if stack.draft else None,
        overlays=_overlays(rt, stack),
        compile_cache_dir=str(rt.settings.state_dir / "compile-cache" / stack.name),
    )
    chosen = _rank(rt, stack, rank)
    if chosen is not None:  # as the host's agent runs it: on loopback, relayed on the host's serving address
        stack = placeable(stack)
    on_disk = [Path(d) for d in (sources.model_dir, sources.draft_dir) if d and Path(d).is_dir()]
    kv = kv_plan(stack, rt.settings, weights=sum(map(folder_bytes, on_disk)),
                 usable=usable_memory(rt.settings, engines_running=True))
    refusal = sleep_refusal(stack.name, kv_bytes=kv, kv_limit=int(rt.settings.wake_kv_max_gib * GIB))
    sleep = stack.sleeps and refusal is None
    plan = render(stack, sources, instance=rt.settings.instance, rank=chosen, placed=chosen is not None,
                  sleep=sleep, kv_cache_bytes=kv)
    for what, cause in additions(stack, sleep, kv):
        typer.echo(f"added by sparkctl: {what}  ({cause})", err=True)
    if kv is not None and len(on_disk) < (2 if stack.draft else 1):
        typer.echo("note: the KV size counts the weights that are on disk; the deploy plans it with all of them",
                   err=True)
    if stack.sleeps and refusal:
        typer.echo(f"not added: sleep mode, so {stack.name} parks by stopping ({refusal.removeprefix('stop: ')})",
                   err=True)
    if any("<" in m.source or "<" in m.target for m in plan.mounts):
        typer.echo(f"note: the paths in <...> are known once the image is: `sparkctl patch check {name}` "
                   "shows them", err=True)
    if fmt is Format.JSON:
        print(plan.to_json())
    elif fmt is Format.COMPOSE:
        YAML().dump(json.loads(json.dumps(plan.compose_service())), rt.console.file)
    else:
        print(plan.docker_run())


def _memory_line(stack: Stack) -> str:
    """How the engine's memory is bounded (issue 46): its KV cache in bytes, or by vLLM."""
    if stack.compose is not None:
        return ("memory: the compose project's engine sizes its KV cache from GPU_MEMORY_UTILIZATION, which "
                "sparkctl sets; its start-up profiling is not bounded by sparkctl (vLLM #46307)")
    if stack.resources.kv_cache == "engine":
        return ("memory: resources.kv_cache: engine: vLLM sizes the KV cache from the fraction, so its start-up "
                "profiling is not bounded (vLLM #46307) and the stack parks by stopping")
    return ("memory: the engine's KV cache is given in bytes at deploy (--kv-cache-memory-bytes: the fraction of "
            "the usable memory less the weights and SPARKCTL_ENGINE_OVERHEAD_GIB); `stacks render` shows it")


def _gateway_lines(stack: Stack) -> list[str]:
    """What the gateway does with the stack's requests: its concurrency cap, each known issue's
    source and whether its cap is enforced or advice, and the request defaults."""
    cap = stack.max_concurrency
    lines = [f"gateway: at most {cap} request(s) at once to this stack" if cap else "gateway: no concurrency cap"]
    for number, issue in enumerate(stack.known_issues, 1):
        lines.append(f'known issue {number}, "{_gist(issue.text)}": {_enforcement(issue)}')
    if stack.request_defaults:
        lines.append("request defaults (added to each request unless the client sets them): "
                     + json.dumps(stack.request_defaults, sort_keys=True))
    else:
        lines.append("request defaults: none")
    return lines


def _enforcement(issue: KnownIssue) -> str:
    source = f"source: {issue.source}" if issue.source else "unsourced"
    if issue.max_concurrency is None:
        return f"no cap; {source}"
    cap = f"cap {issue.max_concurrency}"
    if issue.source:
        return f"{cap}, enforced by the gateway ({source})"
    if issue.enforce:
        return f"{cap}, enforced by the gateway (unsourced; `enforce: true`)"
    return f"{cap}, advice only (unsourced: set `enforce: true` to enforce)"


def _gist(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 60 else text[:59].rstrip() + "…"


def _overlays(rt: Runtime, stack: Stack) -> tuple[tuple[str, str], ...]:
    """The patch sets' mounts. vLLM's dir in the image is known once a deploy or `patch check` has
    looked into the digest `up` would run; the overlay folder's name is known only at deploy."""
    if not stack.patches:
        return ()
    from sparkctl.deploy.patches import VLLM_DIRS, known_vllm_dir, planned_mounts

    digest = _known_digest(rt, stack)
    vllm_dir = known_vllm_dir(digest, cache=rt.settings.state_dir / VLLM_DIRS) if digest else None
    return planned_mounts([rt.catalog.patch_sets[p] for p in stack.patches], patches_dir=rt.settings.patches_dir,
                          overlays_dir=rt.settings.overlays_dir, vllm_dir=vllm_dir)


def _known_digest(rt: Runtime, stack: Stack) -> str | None:
    """The digest `up` would run without asking the registry (as `deploy/image.py` picks it): the
    stack's own, else the pin, else the one an earlier `up` resolved. None: the registry decides."""
    from sparkctl.policy.images import parse_ref

    tagged = parse_ref(stack.image.ref).tagged
    pin = rt.policy.pin_for(tagged)
    recorded = rt.store.digests.get(tagged) if rt.settings.store_path.is_file() else None
    return stack.image.digest or (pin.digest if pin else None) or recorded


def _refuse_invalid(rt: Runtime, catalog: Catalog, wanted: set[Path]) -> None:
    """The first invalid file of those checked is the command's error (naming how many more there
    are); one of the stacks dir's files left out beside the files checked is a warning."""
    bad = [i for i in catalog.invalid if not wanted or i.file.resolve() in wanted]
    for invalid in catalog.invalid:
        if invalid not in bad and invalid.cause is None:
            rt.warn_invalid(invalid)
    if bad:
        first, more = bad[0], sorted({i.file.name for i in bad[1:]} - {bad[0].file.name})
        also = f" (and {len(more)} more invalid files: {', '.join(more)})" if more else ""
        raise SpecError(str(first.file), first.key, first.problem + also, line=first.line)


def _catalog_with(rt: Runtime, paths: list[Path]) -> Catalog:
    """The stacks dir and the owner's, with extra files as the owner's (so they can `extends` any stack)."""
    from sparkctl.spec.load import POLICY_FILE, load_stacks, stack_files

    extra = [p for p in paths if p.name != POLICY_FILE]
    for p in extra:
        if not p.is_file():
            raise SpecError(str(p), "", "no such file")
    given = {p.resolve() for p in extra}
    shipped = [p for p in stack_files(rt.settings.stacks_dir) if p.resolve() not in given]
    owner = [p for p in stack_files(rt.settings.owner_stacks_dir) if p.resolve() not in given]
    patches = rt.settings.patches_dir
    return load_stacks(shipped, owner=[*owner, *extra],
                       patch_files=sorted(patches.glob("*.yaml")) if patches.is_dir() else [])


def _rank(rt: Runtime, stack: Stack, index: int | None) -> Rank | None:
    """The rank `--rank` asks for, on the host that runs it (placed) or would (the fleet file's
    order); without a fleet file, placeholders."""
    from sparkctl.fleet.deploy import rank_on
    from sparkctl.spec.fleet import load_fleet
    from sparkctl.spec.ranks import Rank, RankHost

    if index is None:
        return None
    if stack.parallel is None:
        raise SpecError(str(rt.catalog.files[stack.name]), "parallel", "not a multi-node stack: it has no ranks")
    if index >= stack.parallel.nodes:
        raise SpecError(str(rt.catalog.files[stack.name]), "parallel.nodes",
                        f"rank {index} does not exist: ranks 0 to {stack.parallel.nodes - 1}")
    if not rt.settings.fleet_path.exists():
        unknown = RankHost(f"<rank {index}'s host>", "<its serving interface>", "<its serving address>")
        return Rank(index, "<rank 0's serving address>", unknown)
    fleet = load_fleet(rt.settings.fleet_path)
    hosts = list(_placed_on(rt, stack.name)) or fleet.names[:stack.parallel.nodes]
    if len(hosts) <= index:
        raise SpecError(str(rt.settings.fleet_path), "hosts", f"rank {index} needs {stack.parallel.nodes} hosts; "
                                                               f"there are {len(hosts)}")
    return rank_on(fleet, hosts, index)


def _placed_on(rt: Runtime, stack: str) -> tuple[str, ...]:
    """The hosts a placed stack runs on, by rank, as the fleet's head daemon (its book's owner)
    says; none when no daemon runs here or it heads no fleet."""
    from sparkctl import messages

    if not rt.client.available():
        return ()
    try:
        answer = rt.client.post("/v1/fleet/ps", {"book_only": True})
    except SparkctlError:  # a daemon that heads no fleet
        return ()
    return messages.load(messages.FleetPs, answer).placed.get(stack, ())


def _cache_path(rt: Runtime, weights: Weights | None) -> str:
    assert weights is not None
    if weights.path:
        return weights.path
    from sparkctl.adapters.hub import repo_folder

    return str(repo_folder(rt.settings.hf_cache_dir, weights.repo) / "snapshots" / weights.revision)
