"""`sparkctl switch ALIAS STACK` for a stack placed across the fleet the daemon heads: blue/green
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
from dataclasses import dataclass, replace

import structlog

from sparkctl.daemon.routes import Routes
from sparkctl.daemon.seam import GatewayFromThread
from sparkctl.daemon.switch import SwitchFailed
from sparkctl.errors import SparkctlError
from sparkctl.fleet import placement
from sparkctl.fleet.deploy import Fleetwide
from sparkctl.messages import ParkDone, SwitchDone, WakeDone
from sparkctl.spec.models import Stack
from sparkctl.state.desired import DesiredFile
from sparkctl.state.store import Store

log = structlog.get_logger()


@dataclass
class FleetSwitch:
    fleetwide: Fleetwide
    desired: DesiredFile
    routes: Routes
    store: Store
    total_bytes: int  # a Spark's memory, which stacks' fractions are of
    wait: float  # each host's deploy

    def applies(self, stack: Stack) -> bool:
        """Whether `stack` runs across the fleet: it has a placement or ranks, or is placed already."""
        return stack.placement.fleet or stack.parallel is not None or stack.name in self._book()

    def run(self, alias: str, stack: Stack, gateway: GatewayFromThread) -> SwitchDone:
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
            raise SwitchFailed(error)
        return SwitchDone(alias, stack.name, intent["mode"], previous=old, why=intent["why"], timings=timings,
                          hosts=tuple(hosts))

    def placed(self, stack: str) -> bool:
        return stack in self._book()

    def parked(self, stack: str) -> bool:
        entry = self._book().get(stack)
        return entry is not None and entry.parked

    def park(self, stack: str, drain: Callable[[str], None]) -> ParkDone:
        """Stop the stack's engines on every host once its requests drained; new ones wait in
        the gateway's hold and wake it."""
        if self.parked(stack):
            return ParkDone(stack, "unchanged", f"{stack} is parked already")
        placed = self.fleetwide.park(stack, wait=self.wait, before=lambda: drain(stack))
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

    def _book(self) -> dict[str, placement.Placed]:
        return placement.read_book(self.fleetwide.settings.fleet_dir)
