"""`sparkctl fleet init | join HEAD | status | leave | up STACK | ps | down STACK | check-image REF`:
this Spark's Ray node in a fleet of Sparks, stacks placed across it, and every host's containers
through its host agent.

Nodes, their state and the inventory (`init`, `join`, `status`, `leave`: this Spark's own node
record and token, nothing the daemon owns) and image checks across hosts are run here, through the
backend (Ray) built here; `up`, `down` and `ps` are asked of this Spark's daemon, which heads the
fleet and is the one writer of its placement book (`fleet/machine.py`).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import typer
from rich.markup import escape

from sparkctl import messages
from sparkctl.cli.console import OUTPUT, Column, Output, table
from sparkctl.cli.runtime import Runtime, runtime
from sparkctl.errors import SparkctlError
from sparkctl.fleet import agents, local, membership, survey
from sparkctl.node import AgentAnswer, AgentCall, ImageDigest, NodeState, Pull
from sparkctl.spec.fleet import Fleet, load_fleet

app = typer.Typer(help="A fleet of Sparks on Ray: start or join this Spark's node, see every host's state.",
                  no_args_is_help=True)

HOST = typer.Option(None, "--host", help="The fleet file's host to start as (default: the one whose Ray address "
                                         "is on this machine).")
ADDRESS = typer.Option(None, "--address", help="The address Ray uses on this Spark (overrides the fleet file's); "
                                               "must be on a local interface.")
PORT = typer.Option(None, "--port", help="The node's first port (the head's GCS port); it uses 256 from there.")
HEAD = typer.Option(None, "--head", help="The head's ADDR:PORT (default: the one this Spark joined, else the fleet "
                                         "file's `head`).")
WAIT = typer.Option(10.0, "--wait", min=0.5, help="Seconds each host's agent has to answer before the host is "
                                                  "named unreachable.")
HOSTS = (Column("host", name=True), Column("state"), Column("ray address", name=True), Column("memory", wide=True),
         Column("resources", wide=True), Column("node", wide=True), Column("notes"))
CONTAINERS = (Column("host", name=True), Column("stack", name=True), Column("container", wide=True), Column("state"),
              Column("image"), Column("repo digest", wide=True))


@app.callback()
def _ray() -> None:  # every fleet command runs on Ray, the `fleet` extra: without it, one line saying what to install
    from sparkctl.adapters.ray import require_ray

    require_ray()


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
    _ensure_agent(rt, fleet, record)
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
    _ensure_agent(rt, fleet, record)


@app.command("status")
def show_status(
    ctx: typer.Context,
    head: str | None = HEAD,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    output: Output | None = OUTPUT,
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
    rows = survey.rows(fleet, nodes)
    if as_json:
        print(json.dumps({"head": endpoint, "error": error, "hosts": [r.to_dict() for r in rows]}, indent=2))
    else:
        _table(rt, endpoint, rows, error, output=output)
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


@app.command("up")
def up(ctx: typer.Context, stack: str = typer.Argument(..., help="The stack to place and start."),
       wait: float | None = typer.Option(None, "--wait", min=1, help="Seconds each host has to pull, fetch and start "
                                         "its engine (default: SPARKCTL_FLEET_DEPLOY_TIMEOUT).")) -> None:
    """Place STACK with Ray (its `placement:` section: a host, or replicas on different hosts) and
    start it on each chosen host, once every host holds the same image digest and weights. Asked of
    this Spark's daemon, which heads the fleet and keeps its book."""
    from sparkctl.cli.console import through_daemon

    rt = runtime(ctx)
    done = through_daemon(rt.daemon, "/v1/fleet/up", messages.FleetUpRequest(stack, wait or 0.0),
                          messages.FleetUpDone)
    for note in done.notes:
        rt.console.print(f"[dim]{escape(note)}[/]")
    for replica in done.replicas:
        rt.console.print(f"[green]{escape(stack)}[/] on host {escape(replica.host)} at {escape(replica.url)} "
                         f"({replica.fingerprint})")
    for host, why in done.failed.items():
        rt.console.print(f"[red]host {escape(host)} did not start {escape(stack)}[/]: {escape(why)}")
    if done.failed:
        raise typer.Exit(1)


@app.command("ps")
def ps(ctx: typer.Context, wait: float = WAIT,
       as_json: bool = typer.Option(False, "--json", help="Print JSON."), output: Output | None = OUTPUT) -> None:
    """Every container of this instance on every host, as that host's Docker reports it, and
    the stacks parked across the fleet (no container; their placement kept)."""
    rt = runtime(ctx)
    found = messages.load(messages.FleetPs, rt.daemon.post("/v1/fleet/ps", {"wait": wait}))
    parked = {name: list(found.placed[name]) for name in found.parked}
    if as_json:
        print(json.dumps({"hosts": list(found.hosts), "containers": [asdict(r) for r in found.containers],
                          "unreachable": found.unreachable, "parked": parked}, indent=2))
    else:
        rows = [(escape(row.host), escape(row.stack), escape(row.name), row.state, escape(row.image),
                 (row.repo_digest or "-")[:19]) for row in found.containers]
        rt.console.print(table(CONTAINERS, rows, output=output, title="fleet containers"))
        for name, hosts in parked.items():
            rt.console.print(f"{escape(name)} is parked: no engine runs, its placement on {', '.join(hosts)} is kept")
        _print_unreachable(rt, found.unreachable, "its containers are not listed")
    if found.unreachable:
        raise typer.Exit(1)


@app.command("down")
def down(ctx: typer.Context, stack: str = typer.Argument(..., help="The stack whose containers to remove."),
         wait: float = typer.Option(40.0, "--wait", min=0.5, help="Seconds each host has to confirm its containers "
                                    "are gone.")) -> None:
    """Remove STACK's containers on every host and release its placement; returns once each
    host's Docker confirms they are gone. Asked of this Spark's daemon, which heads the fleet."""
    from sparkctl.cli.console import through_daemon

    rt = runtime(ctx)
    done = through_daemon(rt.daemon, "/v1/fleet/down", messages.FleetDownRequest(stack, wait), messages.FleetDownDone)
    for host, names in done.removed.items():
        what = f"removed {escape(', '.join(names))}" if names else "had none"
        rt.console.print(f"host {escape(host)}: {what} (its Docker confirms none is left)")
    _print_unreachable(rt, done.unreachable, f"{escape(stack)}'s containers there may still run")
    if done.unreachable:
        raise typer.Exit(1)


@app.command("check-image")
def check_image(
    ctx: typer.Context,
    ref: str = typer.Argument(..., help="The image reference (`repo:tag` or `repo@sha256:...`)."),
    pull: bool = typer.Option(False, "--pull", help="Have every host pull REF first (REF must name a digest)."),
    head: str | None = HEAD,
    wait: float = typer.Option(60.0, "--wait", min=0.5, help="Seconds each host has to answer (and pull)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Refuse (exit 1) unless every host holds the same RepoDigest for REF, naming each host that differs."""
    rt = runtime(ctx)
    found, unreachable = survey.images(_ask(rt, head, Pull(ref) if pull else ImageDigest(ref), wait))
    verdict = survey.verdict(ref, found, wanted=_wanted_digest(rt, ref), unreachable=unreachable)
    if as_json:
        print(json.dumps(verdict.to_dict(), indent=2))
    elif verdict.same:
        rt.console.print(f"[green]same image[/] {escape(ref)} on every host: {verdict.expected}")
    else:
        for host, why in verdict.differences.items():
            rt.console.print(f"[red]host {escape(host)}[/] {escape(why)}")
    if not verdict.same:
        raise typer.Exit(1)


def _ensure_agent(rt: Runtime, fleet: Fleet | None, record) -> None:  # noqa: ANN001 - a NodeRecord
    """This Spark's host agent, started with its node; a failure is reported, the node stays up."""
    try:
        answer = agents.ensure_own(_backend(rt), settings=rt.settings, fleet=fleet, host=record.host,
                                   head=record.head, wait=min(30.0, rt.settings.fleet_ray_timeout / 2))
    except SparkctlError as e:
        answer = None
        why = str(e)
    else:
        why = answer.error
    if answer is not None and answer.ok:
        docker = answer.value.docker_url or "the local socket"
        rt.console.print(f"host agent {escape(record.host)} runs (Docker: {escape(docker)})")
    else:
        rt.console.print(f"[yellow]the host agent did not start[/] ({escape(why or '')}); `sparkctl fleet ps` on the "
                         "head starts it once the node is up")


def _ask(rt: Runtime, head: str | None, call: AgentCall, wait: float) -> list[AgentAnswer]:
    fleet = _inventory(rt)
    return agents.ask(_backend(rt), head=membership.head_endpoint(rt.settings, fleet, head), settings=rt.settings,
                      fleet=fleet, call=call, wait=wait)


def _wanted_digest(rt: Runtime, ref: str) -> str | None:
    """The digest REF names, else the one sparkctl recorded for its tag here, else None (majority)."""
    from sparkctl.policy.images import parse_ref

    name = parse_ref(ref)
    if name.digest:
        return name.digest
    return rt.store.digests.get(name.tagged) if rt.settings.store_path.is_file() else None


def _print_unreachable(rt: Runtime, unreachable: dict[str, str], consequence: str) -> None:
    for host, why in unreachable.items():
        rt.console.print(f"[red]host {escape(host)} could not be reached[/] ({escape(why)}); {consequence}")


def _backend(rt: Runtime):  # noqa: ANN202 - the adapter is imported only when a command needs it
    return membership.control_plane(rt.settings)


def _inventory(rt: Runtime) -> Fleet | None:
    """The fleet file, or None when there is none (an explicit SPARKCTL_FLEET_FILE must exist)."""
    path = rt.settings.fleet_path
    if not path.exists() and rt.settings.fleet_file is None:
        return None
    return load_fleet(path)


def _table(rt: Runtime, endpoint: str, rows: list[survey.HostRow], error: str | None, *,
           output: Output | None) -> None:
    shown = []
    colour = {NodeState.ALIVE: "green", NodeState.DEAD: "red", NodeState.UNKNOWN: "yellow"}
    for row in rows:
        own = {k: v for k, v in row.resources.items() if k.startswith("spark:") or k == "CPU"}
        memory = f"{row.memory_gib:g} GiB" if row.memory_gib is not None else "-"
        shown.append((escape(row.host), f"[{colour[row.state]}]{row.state}[/]", row.ray_address or row.expected_address
                      or "-", f"{memory} (ceiling {row.memory_ceiling or '-'})",
                      escape(" ".join(f"{k}={v:g}" for k, v in own.items())), (row.node_id or "-")[:8],
                      escape("; ".join(row.problems))))
    rt.console.print(table(HOSTS, shown, output=output, title=f"fleet at {endpoint}"))
    if error:
        rt.console.print(f"[red]{escape(error)}[/]")
