"""`sparkctl fleet status` as data: each inventory host beside what the backend reports about
it, and the nodes the backend knows that the inventory does not. Pure: the CLI fetches the
nodes once and renders the rows.

A host may have several nodes in the table (a dead one, then the node it rejoined with): the
live one wins, else the last listed. A host with none is `unknown`, as is every host when the
backend did not answer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sparkctl.node import Node, NodeState
from sparkctl.spec.fleet import GIB, Fleet, Host


@dataclass(frozen=True)
class HostRow:
    host: str
    in_inventory: bool
    state: NodeState
    node_id: str | None = None
    head: bool = False
    ray_address: str | None = None  # where the node runs, as Ray reports it
    expected_address: str | None = None  # the inventory's Ray address
    serving: str | None = None  # interface/address from the inventory
    memory_ceiling: str | None = None  # as the inventory writes it
    memory_gib: float | None = None  # the memory resource the node advertises
    resources: dict[str, float] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "state": str(self.state), "problems": list(self.problems)}


def rows(fleet: Fleet | None, nodes: list[Node]) -> list[HostRow]:
    """One row per inventory host (in file order), then one per node of no inventory host."""
    by_host: dict[str | None, list[Node]] = {}
    for node in nodes:
        by_host.setdefault(node.host, []).append(node)
    hosts = list(fleet.hosts) if fleet else []
    known = {h.name for h in hosts}
    listed = [_row(host, _pick(by_host.get(host.name, []))) for host in hosts]
    strays = [_row(None, node) for name, group in by_host.items() if name not in known for node in group]
    return listed + strays


def _pick(nodes: list[Node]) -> Node | None:
    alive = [n for n in nodes if n.state.is_up()]
    return (alive or nodes or [None])[-1]


def _row(host: Host | None, node: Node | None) -> HostRow:
    expected = dict(expected_address=host.ray.address, memory_ceiling=host.memory,
                    serving=f"{host.serving.interface}/{host.serving.address}") if host else {}
    seen = dict(node_id=node.node_id, head=node.head, ray_address=node.address, resources=node.resources,
                memory_gib=round(node.memory_bytes / GIB, 2) if node.memory_bytes is not None else None) if node else {}
    name = host.name if host else (node.host if node and node.host else "?")
    return HostRow(host=name, in_inventory=host is not None, state=node.state if node else NodeState.UNKNOWN,
                   problems=_problems(host, node), **expected, **seen)


def _problems(host: Host | None, node: Node | None) -> tuple[str, ...]:
    if host is None:
        return ("not in the fleet inventory",)
    if node is None:
        return ("Ray does not know this host: run `sparkctl fleet join` on it",)
    if node.address != host.ray.address:
        return (f"Ray runs it at {node.address}, the inventory says {host.ray.address}",)
    return ()
