"""The fleet's containers as the hosts' Docker engines report them, merged from the agents'
answers: the rows of `sparkctl fleet ps` and the outcome of `sparkctl fleet down`. Pure.

A host that did not answer is kept, with its error, in `unreachable`: a listing or a removal
never passes a silent host off as an empty one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sparkctl.node import AgentAnswer


@dataclass(frozen=True)
class ContainerRow:
    host: str
    stack: str
    name: str
    state: str  # Docker's: running, exited, created, ...
    image: str
    repo_digest: str | None = None


@dataclass(frozen=True)
class Census:
    hosts: tuple[str, ...]  # every host asked, in order
    rows: tuple[ContainerRow, ...] = ()
    unreachable: dict[str, str] = field(default_factory=dict)  # host -> why it gave no answer

    @property
    def complete(self) -> bool:
        return not self.unreachable

    def to_dict(self) -> dict[str, Any]:
        return {"hosts": list(self.hosts), "containers": [asdict(r) for r in self.rows],
                "unreachable": self.unreachable}


@dataclass(frozen=True)
class Removal:
    stack: str
    removed: dict[str, tuple[str, ...]]  # host -> names its Docker removed (confirmed gone)
    unreachable: dict[str, str]

    @property
    def complete(self) -> bool:
        return not self.unreachable

    def to_dict(self) -> dict[str, Any]:
        return {"stack": self.stack, "removed": {h: list(n) for h, n in self.removed.items()},
                "unreachable": self.unreachable}


def census(answers: list[AgentAnswer]) -> Census:
    """Rows from each host's `containers()` answer, by host (in asked order), stack and name."""
    order = {a.host: i for i, a in enumerate(answers)}
    rows = [ContainerRow(host=a.host, stack=c["stack"], name=c["name"], state=c["state"], image=c.get("image", ""),
                         repo_digest=c.get("repo_digest")) for a in answers if a.ok for c in a.value]
    rows.sort(key=lambda r: (order[r.host], r.stack, r.name))
    return Census(hosts=tuple(order), rows=tuple(rows), unreachable=_unreachable(answers))


def removal(stack: str, answers: list[AgentAnswer]) -> Removal:
    """What each host's `remove(stack)` confirmed, and which hosts could not confirm anything."""
    removed = {a.host: tuple(a.value.get("removed", ())) for a in answers if a.ok}
    return Removal(stack=stack, removed=removed, unreachable=_unreachable(answers))


def _unreachable(answers: list[AgentAnswer]) -> dict[str, str]:
    return {a.host: a.error or "" for a in answers if not a.ok}
