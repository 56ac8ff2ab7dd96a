"""What every action reads or holds: the machine, the reconciler, the routes, the event bus, the
locks and clocks they share. Built once by the daemon (`daemon/app.py`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkctl.daemon.bridge import GatewayControl
from sparkctl.daemon.events import EventBus
from sparkctl.daemon.machine import DockerMachine
from sparkctl.daemon.metrics import DaemonMetrics
from sparkctl.daemon.reconciler import Reconciler
from sparkctl.daemon.routes import Routes
from sparkctl.daemon.turns import Turns
from sparkctl.deploy.memory import MemoryView
from sparkctl.settings import Settings
from sparkctl.state.store import Store

if TYPE_CHECKING:
    from sparkctl.daemon.actions.machines import Machines
    from sparkctl.fleet.machine import FleetMachine


@dataclass
class Context:
    settings: Settings
    machine: DockerMachine
    reconciler: Reconciler
    routes: Routes
    bus: EventBus
    gateway: GatewayControl  # the gateway's hold, release and drain, from a worker thread
    kick: Callable[[], None]  # ask the reconcile loop for a pass
    metrics: DaemonMetrics = field(default_factory=DaemonMetrics)
    # When each stack last came up or woke (monotonic): its idle time counts from there at least.
    serving_since: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    # Held from a memory decision (switch, park, wake) until it is carried out, so two of them
    # never both count on the same free memory. Taken before any stack's turn, never after.
    memory_lock: threading.RLock = field(default_factory=threading.RLock)
    fleet: FleetMachine | None = None  # on a fleet's head: the machine of the stacks placed across it
    machines: Machines = field(init=False)  # each stack's machine, this Spark's or the fleet's (`Actions.over`)

    @property
    def store(self) -> Store:
        return self.machine.store

    @property
    def turns(self) -> Turns:
        return self.machine.turns

    def memory(self) -> MemoryView:
        return MemoryView(self.settings, self.store, self.machine.catalog(), self.machine.docker)
