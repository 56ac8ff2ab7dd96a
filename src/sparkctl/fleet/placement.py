"""Placing a stack across the fleet, the pure part: the bundles Ray is asked for, the verdict on
what each chosen host would run, and the book of what runs where.

A stack needs its `gpu_memory_utilization` of a Spark's unified memory on each host it runs on;
Ray's `memory` resource on each node is that host's ceiling, so admission across the fleet is
Ray's placement of one bundle per replica (`STRICT_SPREAD`: replicas on different hosts; a named
host adds a sliver of its `spark:<host>` resource). Before anything starts, every chosen host
says what it would run; the hosts must agree on the image digest, the weights' commits, the
patches and the engine environment, or the placement is refused, naming each host that differs.
The book (`Book`, held by the head's daemon, persisted by `adapters/placements.py`) is what the
gateway routes by.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from sparkctl.node import AgentAnswer, host_resource
from sparkctl.spec.models import Stack

GIB = 1 << 30
PINNED_SHARE = 0.001  # of a host's one `spark:<host>` unit: any number of stacks may name the host
COMPARED = ("image", "model", "draft", "patches", "env")  # the parts every replica must share


def group_name(stack: str) -> str:
    """The stack's placement group in Ray (in the instance's namespace)."""
    return f"stack-{stack}"


def bundles(stack: Stack, total_bytes: int) -> tuple[list[dict[str, float]], str]:
    """One bundle per replica (its memory, and its host when named), and the strategy."""
    bundle: dict[str, float] = {"memory": float(int(stack.resources.gpu_memory_utilization * total_bytes))}
    if stack.placement.host is not None:
        bundle[host_resource(stack.placement.host)] = PINNED_SHARE
    count = stack.parallel.nodes if stack.parallel is not None else stack.placement.count  # a group: a rank a host
    return [dict(bundle) for _ in range(count)], "STRICT_SPREAD" if count > 1 else "PACK"


def fits_nowhere(stack: Stack, bundle: dict[str, float], free: dict[str, int], replicas: int) -> str:
    """Why Ray could not place the stack, with the fleet's free memory per host."""
    need = bundle["memory"] / GIB
    where = f" on host {stack.placement.host}" if stack.placement.host else ""
    count = f"{replicas} hosts with" if replicas > 1 else "a host with"
    hosts = ", ".join(f"{h} {b / GIB:.1f} GiB" for h, b in sorted(free.items())) or "no host is alive"
    return (f"{stack.name} fits nowhere in the fleet: it needs {count} {need:.1f} GiB free{where} "
            f"({stack.resources.gpu_memory_utilization:g} of a Spark); free memory per host: {hosts}")


@dataclass(frozen=True)
class Agreement:
    expected: dict[str, str]  # the parts the hosts agree on (the majority's; a tie: the first host's)
    differences: dict[str, str]  # host -> how it differs

    def refusal(self, stack: str) -> str:
        lines = [f"host {h}: {why}" for h, why in self.differences.items()]
        return f"refused to start {stack}: the chosen hosts would not run the same thing\n  " + "\n  ".join(lines)


def agree(answers: list[AgentAnswer]) -> Agreement:
    """Compare the parts each host's `prepare` reported; a host that failed is a difference too."""
    parts = {a.host: {k: a.value.parts.get(k, "") for k in COMPARED} for a in answers if a.ok}
    differences = {a.host: f"could not prepare: {a.error}" for a in answers if not a.ok}
    expected: dict[str, str] = {}
    for key in COMPARED:
        values = [p[key] for p in parts.values()]
        counts = Counter(values)
        expected[key] = next((v for v in values if counts[v] == max(counts.values())), "")
    for host, mine in parts.items():
        off = [f"{k} {_short(mine[k])} where {_holders(parts, k, expected[k])} {_short(expected[k])}"
               for k in COMPARED if mine[k] != expected[k]]
        if off:
            differences[host] = "; ".join(off)
    return Agreement(expected, differences)


def _holders(parts: dict[str, dict[str, str]], key: str, value: str) -> str:
    hosts = sorted(h for h, p in parts.items() if p[key] == value)
    return f"{', '.join(hosts)} {'has' if len(hosts) == 1 else 'have'}"


def _short(value: str) -> str:
    return (value[:19] if value.startswith("sha256:") else value[:40]) or "(none)"


# -- the book -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Replica:
    host: str
    url: str
    fingerprint: str


@dataclass(frozen=True)
class Placed:
    """A placed stack: its placement group, its replicas, and what they were agreed to run (the
    stack file's spec hash and the prepared parts), so a lost replica is replaced with the same.
    A multi-node group has one replica (rank 0, which serves) and `ranks`: its hosts by rank.
    A parked stack runs no engine; its placement (and so its memory) stays reserved in Ray."""

    stack: str
    group: str
    replicas: tuple[Replica, ...]
    spec: str
    parts: dict[str, str]
    ranks: tuple[str, ...] = ()
    parked: bool = False

    @property
    def hosts(self) -> list[str]:
        """Every host it runs on: each rank's, or each replica's."""
        return list(self.ranks) or [r.host for r in self.replicas]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Placed:
        return cls(stack=str(data["stack"]), group=str(data["group"]), spec=str(data["spec"]),
                   replicas=tuple(Replica(**r) for r in data["replicas"]), parts=dict(data["parts"]),
                   ranks=tuple(data.get("ranks", ())), parked=bool(data.get("parked", False)))


class Storage(Protocol):
    """Where the book persists (`adapters.placements.PlacementFile`)."""

    def load(self) -> dict[str, Any]: ...

    def save(self, book: dict[str, Any]) -> None: ...


class Book:
    """What runs where across the fleet, held in memory by its one owner, the head's daemon,
    and written through to `storage` on every change (never read back while the daemon runs).
    Its changes are serialised, so a `fleet up` and a re-placement never lose each other's entry."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._lock = threading.Lock()
        self._entries = {name: Placed.from_dict(entry) for name, entry in storage.load().items()}

    def entries(self) -> dict[str, Placed]:
        with self._lock:
            return dict(self._entries)

    def get(self, stack: str) -> Placed | None:
        return self.entries().get(stack)

    def change(self, change: Callable[[dict[str, Placed]], None]) -> dict[str, Placed]:
        """`change` the book in place and write it through; the book as written."""
        with self._lock:
            book = dict(self._entries)
            change(book)
            self._storage.save({name: asdict(p) for name, p in book.items()})
            self._entries = book
            return dict(book)


def serving(book: dict[str, Placed]) -> dict[str, Placed]:
    """The book's stacks that run engines (not parked): what is routed, watched and probed."""
    return {name: placed for name, placed in book.items() if not placed.parked}
