"""`sparkctl stacks list | show | validate | render`: read-only views of the stack files."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from sparkctl.cli.runtime import Runtime, runtime
from sparkctl.errors import ImageRefused, SpecError

if TYPE_CHECKING:  # the spec layer is imported when a command runs, not when the CLI starts
    from sparkctl.spec.engine import Weights
    from sparkctl.spec.load import Catalog
    from sparkctl.spec.models import Stack

app = typer.Typer(help="List, show, validate and render stacks.", no_args_is_help=True)


class Format(StrEnum):
    DOCKER_RUN = "docker-run"
    COMPOSE = "compose"
    JSON = "json"


@app.command("list")
def list_(ctx: typer.Context) -> None:
    """One row per deployable stack, with what the image policy says of it."""
    rt = runtime(ctx)
    table = Table("stack", "kind", "image", "model", "draft", "mem", "port", "policy")
    table.columns[0].no_wrap = True
    for stack in rt.catalog.deployable():
        table.add_row(
            stack.name, stack.kind, stack.image.ref, _weights(stack.model), _weights(stack.draft),
            f"{stack.resources.gpu_memory_utilization:.2f}", str(stack.port), _verdict(rt, stack),
        )
    rt.console.print(table)


@app.command()
def show(ctx: typer.Context, name: str) -> None:
    """Print a stack as resolved (after `extends`), with its spec hash."""
    from ruamel.yaml import YAML

    from sparkctl.spec.render import spec_hash

    rt = runtime(ctx)
    stack = rt.catalog.stack(name)
    data = stack.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    rt.console.print(f"# {rt.catalog.files[name]}  spec-hash {spec_hash(stack)}")
    YAML().dump(data, rt.console.file)


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
    checked = [s for s in catalog.deployable() if not wanted or catalog.files[s.name].resolve() in wanted]
    for stack in checked:
        try:
            check(rt.policy, stack.image.ref, allow_latest=stack.image.allow_latest)
        except ImageRefused as e:
            raise SpecError(str(catalog.files[stack.name]), "image", str(e)) from None
        for _, why in stack.risks():  # opted into with `allow:`: still worth a look
            rt.console.print(f"[yellow]warning[/]: {stack.name}: {why}")
    rt.console.print(f"[green]ok[/]: {len(checked)} stacks valid")


@app.command("render")
def render_(
    ctx: typer.Context,
    name: str,
    fmt: Format = typer.Option(Format.DOCKER_RUN, "--format", "-f", help="Output format."),
) -> None:
    """Print the container a vLLM stack runs as (weights shown at their HF cache paths)."""
    from ruamel.yaml import YAML

    from sparkctl.spec.models import Kind
    from sparkctl.spec.render import Sources, render

    rt = runtime(ctx)
    stack = rt.catalog.stack(name)
    if stack.kind is Kind.COMPOSE:
        raise SpecError(str(rt.catalog.files[name]), "kind",
                        f"a compose stack runs {rt.settings.compose_dir / stack.compose.project}; nothing to render")
    sources = Sources(
        model_dir=_cache_path(rt, stack.model),
        draft_dir=_cache_path(rt, stack.draft) if stack.draft else None,
        compile_cache_dir=str(rt.settings.state_dir / "compile-cache" / stack.name),
    )
    plan = render(stack, sources, instance=rt.settings.instance)
    if fmt is Format.JSON:
        print(plan.to_json())
    elif fmt is Format.COMPOSE:
        YAML().dump(json.loads(json.dumps(plan.compose_service())), rt.console.file)
    else:
        print(plan.docker_run())


def _catalog_with(rt: Runtime, paths: list[Path]) -> Catalog:
    """The stacks dir plus extra files (so they can `extends` the shipped stacks)."""
    from sparkctl.spec.load import POLICY_FILE, load_patch_sets, load_stacks

    extra = [p for p in paths if p.name != POLICY_FILE]
    for p in extra:
        if not p.is_file():
            raise SpecError(str(p), "", "no such file")
    given = {p.resolve() for p in extra}
    shipped = [p for p in sorted(rt.settings.stacks_dir.glob("*.yaml"))
               if p.name != POLICY_FILE and p.resolve() not in given]
    patch_sets = load_patch_sets(rt.settings.patches_dir) if rt.settings.patches_dir.is_dir() else {}
    return load_stacks([*shipped, *extra], patch_sets=patch_sets)


def _verdict(rt: Runtime, stack: Stack) -> str:
    from sparkctl.policy.images import check

    try:
        check(rt.policy, stack.image.ref, allow_latest=stack.image.allow_latest)
    except ImageRefused as e:
        return f"[red]refused[/]: {str(e).split(':')[0]}"
    pin = rt.policy.pin_for(stack.image.ref)
    return f"pinned {pin.digest[7:19]}" if pin else "ok"


def _weights(weights: Weights | None) -> str:
    if weights is None:
        return "-"
    return weights.path or f"{weights.repo}@{weights.revision}"


def _cache_path(rt: Runtime, weights: Weights | None) -> str:
    assert weights is not None
    if weights.path:
        return weights.path
    from sparkctl.adapters.hub import repo_folder

    return str(repo_folder(rt.settings.hf_cache_dir, weights.repo) / "snapshots" / weights.revision)
