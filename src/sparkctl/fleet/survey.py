"""The fleet as the CLI shows it, from what the backend and the agents report; pure, the CLI asks
and renders.

- `sparkctl fleet status`: each inventory host beside the backend's node for it (several nodes
  for a host, a dead one then the one it rejoined with: the live one wins, else the last
  listed; none, or no answer from the backend: `unknown`), then the nodes of no inventory host.
- `sparkctl fleet ps` and `down` (answered by the head's daemon, `fleet/machine.py`): the hosts'
  containers merged from the agents' answers. A host that did not answer is kept, with its error,
  in `unreachable`: a listing or a removal never passes a silent host off as an empty one.
- `sparkctl fleet check-image`: whether every host holds the same image under a ref, judged by
  registry digest (RepoDigest), before anything starts. `docker load` drops RepoDigests; such a
  host still counts as holding digest D when its image id (the digest of the image's config,
  which names every layer) equals that of a host whose Docker records D. The expected digest is
  the one the ref names, else the one sparkctl recorded for the tag, else the one most hosts
  hold. Every host that differs, lacks the image, or did not answer is named.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkctl.messages import FleetDownDone, FleetPs
from sparkctl.node import AgentAnswer, HostImage, Node, NodeState, unreachable
from sparkctl.spec.fleet import GIB, Fleet, Host


# -- status ----------------------------------------------------------------------------------------
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


# -- containers ------------------------------------------------------------------------------------
def census(answers: list[AgentAnswer]) -> FleetPs:
    """Rows from each host's `containers()` answer, by host (in asked order), stack and name."""
    order = {a.host: i for i, a in enumerate(answers)}
    rows = sorted((c for a in answers if a.ok for c in a.value), key=lambda r: (order[r.host], r.stack, r.name))
    return FleetPs(hosts=tuple(order), containers=tuple(rows),
                   unreachable=unreachable(answers))


def removal(stack: str, answers: list[AgentAnswer]) -> FleetDownDone:
    """What each host's `remove(stack)` confirmed, and which hosts could not confirm anything."""
    return FleetDownDone(stack, {a.host: a.value.removed for a in answers if a.ok}, unreachable(answers))


# -- image drift -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    ref: str
    expected: str | None
    digests: dict[str, str | None]  # host -> the digest it holds (inferred where load lost it)
    differences: dict[str, str]  # host -> how it differs; empty when every host agrees

    @property
    def same(self) -> bool:
        return not self.differences

    def to_dict(self) -> dict[str, Any]:
        return {"ref": self.ref, "expected": self.expected, "same": self.same, "digests": self.digests,
                "differences": self.differences}


def images(answers: list[AgentAnswer]) -> tuple[list[HostImage], dict[str, str]]:
    """The agents' `image_digest` (or `pull`) answers, and the hosts without one."""
    found = [a.value for a in answers if a.ok]
    return found, unreachable(answers)


def verdict(ref: str, hosts: list[HostImage], *, wanted: str | None = None,
            unreachable: dict[str, str] | None = None) -> Verdict:
    """Compare every host's digest for `ref` with the expected one (`wanted`, else the majority)."""
    digests = {h.host: _digest(h, hosts) for h in hosts}
    expected = wanted or _majority([d for d in digests.values() if d])
    holders = [h for h, d in digests.items() if d == expected]
    differences = {host: f"could not be asked: {why}" for host, why in (unreachable or {}).items()}
    for host in hosts:
        problem = _difference(ref, host, digests[host.host], expected, holders, named=wanted is not None)
        if problem:
            differences[host.host] = problem
    return Verdict(ref=ref, expected=expected, digests=digests, differences=differences)


def _digest(host: HostImage, hosts: list[HostImage]) -> str | None:
    if host.repo_digest or not host.present:
        return host.repo_digest
    same = {h.repo_digest for h in hosts if h.repo_digest and h.image_id == host.image_id}
    return same.pop() if len(same) == 1 else None


def _majority(digests: list[str]) -> str | None:
    if not digests:
        return None
    counts = Counter(digests)
    best = max(counts.values())
    return next(d for d in digests if counts[d] == best)  # a tie goes to the first host's


def _difference(ref: str, host: HostImage, digest: str | None, expected: str | None, holders: list[str], *,
                named: bool) -> str | None:
    if not host.present:
        return f"has no image {ref}: pull it by digest there ({ref.split('@')[0]}@{expected or 'sha256:...'})"
    if digest is None:
        return (f"has {ref} as image {_short(host.image_id)} with no RepoDigest (`docker load` drops it) and no "
                "other host holds that image by digest: pull it by digest there")
    if expected is None or digest == expected:
        return None
    where = f"{ref.split('@')[0]}@{_short(expected)} is expected" if named and not holders else \
        f"{', '.join(holders) or 'the ref'} {'has' if len(holders) == 1 else 'have'} {_short(expected)}"
    return f"has {_short(digest)} where {where}"


def _short(digest: str | None) -> str:
    return (digest or "?")[:19]
