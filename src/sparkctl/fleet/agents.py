"""Talking to the fleet's host agents from the head: which hosts to ask, which agents to ensure,
and one call fanned out to all of them. Behind `sparkctl fleet ps | down | check-image`.

Every host of the inventory (and any other host Ray knows) gets an answer: a host Ray does not
report alive is answered for at once with its state, and one that is alive but silent gets the
backend's timeout, so no host is ever left out of a result. Agents are ensured on every live
host before each call, so a rejoined host has its agent back without a separate step.
"""

from __future__ import annotations

from sparkctl.errors import SparkctlError
from sparkctl.fleet import local
from sparkctl.fleet.backend import FleetBackend
from sparkctl.node import AgentAnswer, AgentCall, AgentSpec, Describe, Node
from sparkctl.settings import Settings
from sparkctl.spec.fleet import Fleet


def ask(backend: FleetBackend, *, head: str, settings: Settings, fleet: Fleet | None, call: AgentCall,
        wait: float, only: list[str] | None = None, nodes: list[Node] | None = None) -> list[AgentAnswer]:
    """`call` on every host's agent (or on those of `only`, in that order); one answer per host,
    inventory order first. `nodes`: the node table, when the caller just read it."""
    nodes = backend.nodes(head) if nodes is None else nodes
    alive = live_hosts(nodes)
    hosts = hosts_to_ask(fleet, nodes) if only is None else only
    asked = backend.ask_agents(head, local_address=driver_address(settings), hosts=[h for h in hosts if h in alive],
                               call=call, wait=wait,
                               ensure=specs(fleet, alive, settings.instance)) if alive else []
    by_host = {a.host: a for a in asked}
    return [by_host.get(h) or AgentAnswer(host=h, error=_not_alive(h, nodes)) for h in hosts]


def specs(fleet: Fleet | None, hosts: list[str], instance: str) -> list[AgentSpec]:
    """The agent each live host should run: its inventory Docker URL (default: its local socket)
    and serving address (default: loopback, a fleet of one)."""
    known = {h.name: h for h in fleet.hosts} if fleet else {}
    return [AgentSpec(host=h, docker_url=known[h].docker if h in known else None, instance=instance,
                      address=known[h].serving.address if h in known else None) for h in hosts]


def hosts_to_ask(fleet: Fleet | None, nodes: list[Node]) -> list[str]:
    """The inventory's hosts in file order, then any other host Ray knows."""
    names = list(fleet.names) if fleet else []
    return names + sorted({n.host for n in nodes if n.host and n.host not in names})


def live_hosts(nodes: list[Node]) -> list[str]:
    return sorted({n.host for n in nodes if n.host and n.state.is_up()})


def driver_address(settings: Settings) -> str:
    """The address the head's driver uses: that of this Spark's own node (Ray needs one here)."""
    record = local.read_record(settings.fleet_dir / local.RECORD_FILE)
    if record is None:
        raise SparkctlError("this Spark runs no fleet node, and calls to the hosts' agents go through one: run "
                            "this on a Spark that ran `sparkctl fleet init` or `join`")
    return record.address


def _not_alive(host: str, nodes: list[Node]) -> str:
    states = [str(n.state) for n in nodes if n.host == host]
    if not states:
        return "Ray knows no node for this host: run `sparkctl fleet join` on it"
    return f"Ray reports its node {states[-1]}: bring the host back and run `sparkctl fleet join` on it"


def ensure_own(backend: FleetBackend, *, settings: Settings, fleet: Fleet | None, host: str, head: str,
               wait: float) -> AgentAnswer:
    """Start this Spark's own agent after `init`/`join` (idempotent), and say whether it answers."""
    answers = backend.ask_agents(head, local_address=driver_address(settings), hosts=[host], call=Describe(),
                                 wait=wait, ensure=specs(fleet, [host], settings.instance))
    return answers[0]
