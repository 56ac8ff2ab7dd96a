"""The fleet as the head's daemon runs stacks on it: `fleet up`, `fleet down` and `fleet ps`
asked of the daemon (it is the one writer of the placement book: `Fleetwide.book`), and the
machine behind `switch`, `park` and `wake` of a stack placed across the fleet, beside this Spark's
own Docker machine (`daemon/actions`). Blocking, called on a worker: the daemon's actions
(`daemon/actions/machines.Fleet`) take the stack's turn on the loop and call it through the seam,
and it reaches the gateway through `seam.GatewayFromThread`.

`sparkctl switch ALIAS STACK` for a stack placed across the fleet the daemon heads: blue/green
across hosts. The new stack is placed and started where Ray fits it (`fleet up`: every chosen
host agrees on what it runs first), the alias flips in one step of the routes, the old stack's
requests drain, and an old placed stack is then removed from every host. A local old stack is
left as it runs (its own `switch` to another local stack parks it). Nothing is held: both stacks
serve until the flip, so the agent sees no failed request. A failure before the flip leaves the
alias where it was. Recorded like any switch (a daemon killed mid-way settles it on start).

`sparkctl park` and `wake` of a placed stack stop and start its engines on every host (a group
whole) and keep its placement, so a wake always fits. Sleep mode is not used: whether vLLM's
`/sleep` reaches the ranks of other nodes has not been verified here, and a single stack placed
on a host is parked the same way for one rule. The gateway wakes it on its first request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

import structlog

from sparkctl import messages
from sparkctl.errors import SparkctlError
from sparkctl.fleet import agents, placement, survey
from sparkctl.fleet.deploy import Fleetwide
from sparkctl.messages import FleetDownDone, FleetPs, FleetUpDone, ParkDone, SwitchDone, WakeDone
from sparkctl.node import Containers
from sparkctl.spec.models import Stack
from sparkctl.state.store import Store

if TYPE_CHECKING:
    from sparkctl.daemon.routes import Routes
    from sparkctl.daemon.seam import GatewayFromThread
    from sparkctl.spec.load import Catalog
    from sparkctl.state.desired import DesiredFile

log = structlog.get_logger()


@dataclass(kw_only=True)
class FleetMachine:
    fleetwide: Fleetwide
    catalog: Callable[[], Catalog]
    desired: DesiredFile
    routes: Routes
    store: Store
    gateway: GatewayFromThread
    total_bytes: int  # a Spark's memory, which stacks' fractions are of
    wait: float  # each host's deploy

    def up(self, stack: str, *, wait: float, say: Callable[[str], None]) -> FleetUpDone:
        """Place `stack` with Ray and start it on each chosen host (`Fleetwide.up`); routed at once."""
        spec = self.catalog().stack(stack)
        done = self.fleetwide.up(spec, total_bytes=self.total_bytes, wait=wait or self.wait, say=say)
        self.routes.refresh()
        return FleetUpDone(stack, tuple(messages.FleetReplica(**asdict(r)) for r in done.placed.replicas),
                           done.failed, tuple(dict.fromkeys(done.notes)))

    def down(self, stack: str, *, wait: float) -> FleetDownDone:
        """Remove the stack's containers on every host and release its placement."""
        done = survey.removal(stack, self.fleetwide.down(stack, wait=wait))
        self.routes.refresh()
        return done

    def ps(self, *, wait: float, book_only: bool = False) -> FleetPs:
        """Every host's containers of this instance (unless `book_only`), and the book."""
        f = self.fleetwide
        found = survey.census([] if book_only else agents.ask(f.backend, head=f.head, settings=f.settings,
                                                              fleet=f.fleet, call=Containers(), wait=wait))
        book = f.book.entries()
        return replace(found, placed={name: tuple(p.hosts) for name, p in book.items()},
                       parked=tuple(name for name, p in book.items() if p.parked))

    def runs(self, stack: str) -> bool:
        """Whether `stack` runs across the fleet: it is placed already, or its file places it
        (a placement or ranks)."""
        spec = self.catalog().stacks.get(stack)
        return stack in self._book() or (spec is not None and (spec.placement.fleet or spec.parallel is not None))

    def serves(self, stack: str) -> bool:
        """Whether the stack is placed (up or parked), so the gateway may send it a request."""
        return stack in self._book()

    def switch(self, alias: str, stack: Stack) -> SwitchDone:
        gateway = self.gateway
        old = self.desired.read().aliases.get(alias)
        intent = {"alias": alias, "from": old, "to": stack.name, "mode": "fleet blue/green", "stop_old": False,
                  "new_was_desired": True, "park": "stop", "wake": 0, "evict": [],
                  "why": f"{stack.name} is placed across the fleet"}
        switch_id = self.store.switches.begin(intent)
        started, timings, hosts, error = time.time(), {}, [], None
        try:
            up = self.fleetwide.up(stack, total_bytes=self.total_bytes, wait=self.wait)
            if not up.placed.replicas:
                raise SparkctlError(f"{stack.name} started on no host: "
                                    + "; ".join(f"{h}: {why}" for h, why in up.failed.items()))
            hosts = up.placed.hosts
            timings["deploy_s"] = round(time.time() - started, 3)
            self.desired.update(lambda d: replace(d, aliases={**d.aliases, alias: stack.name}))
            self.routes.refresh()
            gateway.routes_changed()
            timings["flip_s"] = round(time.time() - started, 3)
            if old and old != stack.name:
                gateway.drain(old)
                timings["drain_s"] = round(time.time() - started, 3)
                if old in self._book():
                    self.fleetwide.down(old, wait=self.wait)
                    self.routes.refresh()
        except SparkctlError as e:
            error = str(e)
        timings["total_s"] = round(time.time() - started, 3)
        record = intent | {"ok": error is None, "error": error, "timings": timings, "hosts": hosts}
        self.store.switches.finish(switch_id, record)
        log.info("switch_finished", **{k: v for k, v in record.items() if k != "timings"}, **timings)
        if error is not None:
            raise SparkctlError(error)  # rolled back: the alias names what it did
        return SwitchDone(alias, stack.name, intent["mode"], previous=old, why=intent["why"], timings=timings,
                          hosts=tuple(hosts))

    def parked(self, stack: str) -> bool:
        entry = self._book().get(stack)
        return entry is not None and entry.parked

    def park(self, stack: str) -> ParkDone:
        """Stop the stack's engines on every host (sleep mode is not used across hosts) once its
        requests drained; new ones wait in the gateway's hold and wake it."""
        if self.parked(stack):
            return ParkDone(stack, "unchanged", f"{stack} is parked already or in use")
        placed = self.fleetwide.park(stack, wait=self.wait, before=lambda: self._quiesce(stack))
        self.routes.refresh()
        self.store.events.record(stack, "parked", f"stopped on {', '.join(placed.hosts)}")
        what = f"its {len(placed.ranks)} ranks" if placed.ranks else "its engines"
        return ParkDone(stack, "stop", f"stop: {stack} is placed across the fleet, so {what} stop on every host "
                        "and its placement stays reserved (sleep mode is not used across hosts)")

    def wake(self, stack: str) -> WakeDone:
        """Start a parked placed stack again where Ray has its bundles; routed once it serves."""
        began = time.monotonic()
        done = self.fleetwide.wake(stack, wait=self.wait, within=self.fleetwide.settings.fleet_replace_within)
        self.routes.refresh()
        self.store.events.record(stack, "woke", f"started cold on {', '.join(done.entry.hosts)}")
        return WakeDone(stack, 0, round(time.monotonic() - began, 3))

    def _quiesce(self, stack: str) -> None:
        """Before its engines stop: the gateway stops routing to it (its names now wake it) and
        its accepted requests finish."""
        self.routes.refresh()
        self.gateway.drain(stack)

    def _book(self) -> dict[str, placement.Placed]:
        return self.fleetwide.book.entries()
