"""What the daemon does when asked: up, down, switch, status, history and metrics. The API's
handlers call these on a worker thread (through the `Service` protocol in `api.py`); each
action on a stack runs in its turn (`turns.py`), marked busy so reconcile passes leave it alone.
Results are returned as values; the store only records them."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkctl.adapters.docker import DockerEngine
from sparkctl.daemon import planner
from sparkctl.daemon.events import BusReporter, EventBus
from sparkctl.daemon.machine import DockerMachine
from sparkctl.daemon.metrics import DaemonMetrics
from sparkctl.daemon.reconciler import Reconciler
from sparkctl.daemon.switch import GatewayControl, Switcher
from sparkctl.daemon.turns import Turns
from sparkctl.daemon.verdicts import Verdicts
from sparkctl.deploy.pipeline import memory_shares
from sparkctl.deploy.status import other_instances, status_rows
from sparkctl.errors import ImageRefused, SparkctlError
from sparkctl.gateway.routes import RouteTable, build_table
from sparkctl.policy.switch import plan_switch
from sparkctl.settings import Settings
from sparkctl.spec.load import Catalog
from sparkctl.state.desired import Desired
from sparkctl.state.store import Store
from sparkctl.wire import DownDone, UpDone


@dataclass
class Routes:
    """What the gateway routes to: running containers whose deployment passed its health checks
    (a failed redeploy leaves the previous, healthy one routed; one still loading is not)."""

    docker: DockerEngine
    store: Store
    catalog: Callable[[], Catalog]
    desired: Callable[[], Desired]
    table: RouteTable = field(default_factory=RouteTable)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # a rebuild from older reads must not land last

    def refresh(self) -> None:
        with self._lock:
            running = {c.stack for c in self.docker.containers()
                       if c.running and c.fingerprint in self.store.deployments.healthy_fingerprints(c.stack)}
            stacks = {s.name: (s.served_name, s.port, s.max_concurrency) for s in self.catalog().deployable()}
            self.table = build_table(aliases=self.desired().aliases, stacks=stacks, running=running)


@dataclass
class Operations:
    settings: Settings
    machine: DockerMachine
    reconciler: Reconciler
    routes: Routes
    bus: EventBus
    kick: Callable[[], None]  # ask the reconcile loop for a pass
    metrics: DaemonMetrics = field(default_factory=DaemonMetrics)
    gateway: GatewayControl | None = None  # set once the gateway listens; a switch needs it

    @property
    def store(self) -> Store:
        return self.machine.store

    @property
    def turns(self) -> Turns:
        return self.machine.turns

    def check_stack(self, name: str) -> str:
        return self.machine.catalog().stack(name).name

    def desired(self) -> Desired:
        return self.machine.desired()

    def up(self, stack: str, *, refresh: bool = False, replace: bool = False, ticket: int | None = None
           ) -> UpDone:
        started = time.time()
        with self.turns.turn(stack, ticket):
            was_desired = stack in self.machine.desired().stacks
            self.machine.update_desired(lambda d: d.with_stack(stack))
            self.reconciler.forget(stack)
            try:
                with self.reconciler.holding(stack):
                    result = self.machine.deploy(stack, refresh=refresh, replace=replace)
            except ImageRefused:  # the policy refuses it: retrying cannot help, so a new stack is not kept desired
                if not was_desired:
                    self.machine.update_desired(lambda d: d.without_stack(stack))
                self.metrics.outcome(stack, ok=False)
                raise
            except SparkctlError:
                self.metrics.outcome(stack, ok=False)
                raise
            finally:
                self.routes.refresh()
                self.kick()
        if result is None:
            raise SparkctlError(f"{stack} was taken down while it was being deployed")
        self.metrics.outcome(stack, ok=True)
        self.metrics.phase("deploy", time.time() - started)
        return UpDone(stack, result.fingerprint, unchanged=not result.changed)

    def down(self, stack: str, *, ticket: int | None = None) -> DownDone:
        with self.turns.turn(stack, ticket):
            self.machine.update_desired(lambda d: d.without_stack(stack))
            with self.reconciler.holding(stack):
                removed = self.machine.down(stack)
        self.kick()
        return DownDone(stack, removed)

    def switch(self, alias: str, stack: str, *, ticket: int | None = None) -> dict[str, Any]:
        """Move `alias` to `stack` (blue/green or hold/swap); rolled back on any failure."""
        with self.turns.turn(f"alias:{alias}", ticket):  # one switch of an alias at a time
            spec = self.machine.catalog().stack(stack)
            if self.machine.desired().aliases.get(alias) == spec.name:  # as `up` does: make sure, change nothing
                return {"alias": alias, "stack": spec.name, "mode": "unchanged", "timings": {},
                        "up": asdict(self.up(spec.name))}
            plan = plan_switch(alias, spec.name, fraction=spec.resources.gpu_memory_utilization,
                               aliases=self.machine.desired().aliases, running=memory_shares(self.machine.docker),
                               ceiling=self.settings.memory_ceiling)
            assert self.gateway is not None, "the gateway starts before the API"
            self.reconciler.forget(spec.name)
            verdicts = Verdicts(self.settings, self.store, self.bus, lambda name: self.machine.catalog().stack(name))
            switcher = Switcher(machine=self.machine, reconciler=self.reconciler, gateway=self.gateway,
                                refresh_routes=self.routes.refresh, store=self.store, reporter=BusReporter(self.bus),
                                bench=verdicts.bench, blame=verdicts.blame,
                                bench_mode=lambda s: self.machine.catalog().stack(s).switch.bench)
            try:
                return switcher.run(plan)
            finally:
                self.kick()

    def status(self) -> dict[str, Any]:
        """The CLI's status rows, plus desired stacks without a container and failure marks."""
        desired = self.machine.desired()
        rows = status_rows(self.machine.docker, self.store, self.machine.catalog())
        seen = {r["stack"] for r in rows}
        history = self.reconciler.history
        rows += [{"stack": s, "phase": "failed" if history.get(s, planner.History()).failed else "pending",
                  "state": "absent", "endpoint": "", "fingerprint": None, "container": "", "uptime_s": None,
                  "memory": None, "error": None} for s in desired.stacks if s not in seen]
        for row in rows:
            h = history.get(row["stack"], planner.History())
            row |= {"desired": row["stack"] in desired.stacks, "failed": h.failed, "recent_failures": len(h.failures)}
        return {"stacks": rows, "aliases": desired.aliases, "pid": os.getpid(), "instance": self.settings.instance,
                "others": other_instances(self.machine.docker)}

    def history(self, stack: str | None) -> dict[str, Any]:
        store = self.store
        deployments = [{"id": d.id, "stack": d.stack, "phase": d.phase.value, "fingerprint": d.fingerprint,
                        "started": d.started, "finished": d.finished, "error": d.error,
                        "transitions": [(p.value, at, detail) for p, at, detail in store.deployments.transitions(d.id)]}
                       for d in store.deployments.history(stack)]
        return {"deployments": deployments, "events": store.events.list(stack), "switches": store.switches.list()}

    def metrics_text(self) -> str:
        states = {o.stack: o.state for o in self.machine.observe()}
        states |= {s: "failed" for s, h in self.reconciler.history.items() if h.failed}
        return self.metrics.render(passes=self.reconciler.passes, restarts=self.reconciler.restarts, states=states)
