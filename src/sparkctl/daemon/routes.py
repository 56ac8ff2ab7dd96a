"""The gateway's route table, rebuilt from what runs: containers whose deployment passed its
health checks, the stacks placed across the fleet, the aliases and their routing rules."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from sparkctl.adapters.docker import DockerEngine
from sparkctl.fleet import placement
from sparkctl.gateway.routes import RouteTable, Upstream, build_table
from sparkctl.spec.load import Catalog
from sparkctl.spec.models import Stack
from sparkctl.state.desired import Desired
from sparkctl.state.store import Store


@dataclass
class Routes:
    """What the gateway routes to: running containers whose deployment passed its health checks
    (a failed redeploy leaves the previous, healthy one routed; one still loading is not), and
    the stacks placed across the fleet, at their replicas' URLs as the book has them."""

    docker: DockerEngine
    store: Store
    catalog: Callable[[], Catalog]
    desired: Callable[[], Desired]
    placed: Callable[[], dict[str, placement.Placed]] = dict  # the book, as its owner holds it
    engine_auth: Callable[[], str] = lambda: ""  # what placed engines' relays ask for (`membership.relay_auth`)
    # Stacks whose hung engine is restarting (the sentinel's): kept routed, their replica held out,
    # so their requests wait for the restart instead of meeting a 404.
    restarting: Callable[[], set[str]] = set
    table: RouteTable = field(default_factory=RouteTable)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # a rebuild from older reads must not land last

    def refresh(self) -> None:
        with self._lock:
            desired = self.desired()
            running = {c.stack for c in self.docker.containers() if c.running and not c.placed
                       and c.stack not in desired.parked
                       and c.fingerprint in self.store.deployments.healthy_fingerprints(c.stack)}
            running |= self.restarting() & set(desired.stacks)
            stacks = {s.name: upstream_of(s) for s in self.catalog().deployable()}
            placed = self.placed()
            serving = placement.serving(placed)
            auth = self.engine_auth() if serving else None
            for name, entry in serving.items():
                if name in stacks and entry.replicas:
                    first, *others = (r.url for r in entry.replicas)
                    stacks[name] = dataclasses.replace(stacks[name], url=first, replicas=tuple(others), placed=True,
                                                       auth=auth)
                    running.add(name)
            self.table = build_table(aliases=desired.aliases, stacks=stacks, running=running,
                                     parked=set(desired.parked) | {n for n, e in placed.items() if e.parked},
                                     routes=desired.routes)


def upstream_of(stack: Stack) -> Upstream:
    """What the gateway needs of a stack: where it listens, its served name, its enforced
    concurrency cap (known issues with a source or `enforce: true`) and its request defaults."""
    return Upstream(stack.name, stack.url, stack.served_name, stack.max_concurrency, stack.request_defaults)
