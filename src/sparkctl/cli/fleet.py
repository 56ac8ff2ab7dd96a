"""`sparkctl fleet init | join HEAD | status | leave`: this Spark's Ray node in a fleet of Sparks.

The first slice of the fleet: nodes, their state and the inventory. Placing stacks across hosts
is not here yet. The backend (Ray) is built here and passed down; the steps are in `fleet`.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from sparkctl.cli.runtime import Runtime, runtime
from sparkctl.errors import SparkctlError
from sparkctl.fleet import local, membership, status
from sparkctl.node import NodeState
from sparkctl.spec.fleet import Fleet, load_fleet

app = typer.Typer(help="A fleet of Sparks on Ray: start or join this Spark's node, see every host's state.",
                  no_args_is_help=True)

HOST = typer.Option(None, "--host", help="The fleet file's host to start as (default: the one whose Ray address "
                                         "is on this machine).")
ADDRESS = typer.Option(None, "--address", help="The address Ray uses on this Spark (overrides the fleet file's); "
                                               "must be on a local interface.")
PORT = typer.Option(None, "--port", help="The node's first port (the head's GCS port); it uses 256 from there.")


@app.command("init")
def init(ctx: typer.Context, host: str | None = HOST, address: str | None = ADDRESS, port: int | None = PORT) -> None:
    """Start the fleet's head on this Spark, with token authentication on."""
    rt = runtime(ctx)
    fleet = _inventory(rt)
    chosen = local.choose_host(fleet, name=host, address=address, port=port)
    local.ensure_token(membership.token_path(rt.settings))
    record = membership.start(_backend(rt), rt.settings, chosen, head=None, inventory=fleet is not None)
    rt.console.print(f"[green]started[/] the fleet's head as host {escape(record.host)} at {escape(record.head)} "
                     f"(pids {' '.join(map(str, _backend(rt).running(record)))})")
    rt.console.print(f"On each other Spark: copy {membership.token_path(rt.settings)} to the same place (mode 0600), "
                     f"then run `sparkctl fleet join {escape(record.head)}`.")


@app.command("join")
def join(
    ctx: typer.Context,
    head: str = typer.Argument(..., help="The head's ADDR:PORT, as `fleet init` printed it."),
    host: str | None = HOST,
    address: str | None = ADDRESS,
    port: int | None = PORT,
    token_file: Path | None = typer.Option(None, "--token-file", help="The head's token file, copied here (kept "
                                                                       "0600 in this Spark's state dir)."),
) -> None:
    """Join this Spark to the fleet whose head is HEAD."""
    rt = runtime(ctx)
    fleet = _inventory(rt)
    chosen = local.choose_host(fleet, name=host, address=address, port=port)
    if token_file is not None:
        local.install_token(token_file, membership.token_path(rt.settings))
    local.check_token(membership.token_path(rt.settings))
    record = membership.start(_backend(rt), rt.settings, chosen, head=membership.endpoint(head),
                              inventory=fleet is not None)
    rt.console.print(f"[green]joined[/] the fleet at {escape(record.head)} as host {escape(record.host)} "
                     f"({escape(record.address)})")


@app.command("status")
def show_status(
    ctx: typer.Context,
    head: str | None = typer.Option(None, "--head", help="The head's ADDR:PORT (default: the one this Spark "
                                                         "joined, else the fleet file's `head`)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Every host of the fleet file as Ray sees it, beside what the file expects."""
    rt = runtime(ctx)
    fleet = _inventory(rt)
    endpoint = membership.head_endpoint(rt.settings, fleet, head)
    error = None
    try:
        nodes = _backend(rt).nodes(endpoint)
    except SparkctlError as e:
        nodes, error = [], str(e)
    rows = status.rows(fleet, nodes)
    if as_json:
        print(json.dumps({"head": endpoint, "error": error, "hosts": [r.to_dict() for r in rows]}, indent=2))
    else:
        _table(rt, endpoint, rows, error)
    if error:
        raise typer.Exit(1)


@app.command("leave")
def leave(ctx: typer.Context) -> None:
    """Stop this Spark's Ray node: only the processes its start recorded."""
    rt = runtime(ctx)
    left = membership.leave(_backend(rt), rt.settings)
    if left is None:
        rt.console.print("this Spark runs no fleet node (nothing recorded in its state dir)")
        return
    record, pids = left
    rt.console.print(f"[yellow]left[/] the fleet at {escape(record.head)}: stopped host {escape(record.host)}'s "
                     f"{len(pids)} processes")


def _backend(rt: Runtime):  # noqa: ANN202 - the adapter is imported only when a command needs it
    from sparkctl.adapters.ray import RayBackend

    return RayBackend(token_file=membership.token_path(rt.settings), timeout=rt.settings.fleet_ray_timeout,
                      namespace=f"sparkctl-{rt.settings.instance}")


def _inventory(rt: Runtime) -> Fleet | None:
    """The fleet file, or None when there is none (an explicit SPARKCTL_FLEET_FILE must exist)."""
    path = rt.settings.fleet_path
    if not path.exists() and rt.settings.fleet_file is None:
        return None
    return load_fleet(path)


def _table(rt: Runtime, endpoint: str, rows: list[status.HostRow], error: str | None) -> None:
    table = Table("host", "state", "ray address", "memory", "resources", "node", "notes", title=f"fleet at {endpoint}")
    colour = {NodeState.ALIVE: "green", NodeState.DEAD: "red", NodeState.UNKNOWN: "yellow"}
    for row in rows:
        own = {k: v for k, v in row.resources.items() if k.startswith("spark:") or k == "CPU"}
        memory = f"{row.memory_gib:g} GiB" if row.memory_gib is not None else "-"
        table.add_row(escape(row.host), f"[{colour[row.state]}]{row.state}[/]", row.ray_address or row.expected_address
                      or "-", f"{memory} (ceiling {row.memory_ceiling or '-'})",
                      escape(" ".join(f"{k}={v:g}" for k, v in own.items())), (row.node_id or "-")[:8],
                      escape("; ".join(row.problems)))
    rt.console.print(table)
    if error:
        rt.console.print(f"[red]{escape(error)}[/]")
