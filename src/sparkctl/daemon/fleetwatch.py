"""The daemon's watch over the fleet it heads: hosts Ray declares dead leave routing at once, the
stacks they served are re-placed, and a host that comes back is swept of what now runs elsewhere.

A child process reads Ray's node table every 0.1 s and reports each change (`FleetBackend.watch`).
When a host that serves placed stacks is no longer alive, the gateway ejects every replica on its
serving address in the same step, so requests go to the other replicas, or wait in the gateway's
hold while a stack has none; then each such stack is re-placed where Ray put its bundles and the
routes are rebuilt, which lets the held requests go. The time from Ray's verdict to the eject is
logged (`fleet_host_ejected`). Runs on its own thread; started by the daemon on a fleet's head.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog

from sparkctl.daemon.events import EventBus
from sparkctl.errors import SparkctlError
from sparkctl.fleet import agents, placement
from sparkctl.fleet.deploy import Fleetwide
from sparkctl.gateway.proxy import LoopControl
from sparkctl.node import LABEL_ADDRESS, Node
from sparkctl.wire import Note

log = structlog.get_logger()
RETRY = 1.0  # s before watching again after the head stopped answering


class FleetWatch:
    def __init__(self, fleetwide: Fleetwide, *, control: Callable[[], LoopControl | None],
                 refresh: Callable[[], None], bus: EventBus, wait: float, within: float) -> None:
        self.fleetwide, self.control, self.refresh, self.bus = fleetwide, control, refresh, bus
        self.wait, self.within = wait, within  # an agent's deploy; Ray's re-placement
        self.down: set[str] = set()  # hosts taken out of routing
        self._stopping = threading.Event()
        self._watch = None
        self._thread = threading.Thread(target=self._run, name="fleet-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._watch is not None:
            self._watch.close()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._watch = self.fleetwide.backend.watch(self.fleetwide.head)
                for nodes in self._watch:
                    self.on_nodes(nodes)
            except SparkctlError as e:
                if not self._stopping.is_set():
                    log.warning("fleet_watch_lost", error=str(e), retry_s=RETRY)
            except Exception:  # noqa: BLE001 - the watch must outlive any one bad step (a hand-edited book)
                log.exception("fleet_watch_failed", retry_s=RETRY)
            finally:
                if self._watch is not None:
                    self._watch.close()  # its child too
            self._stopping.wait(RETRY)

    def on_nodes(self, nodes: list[Node]) -> None:
        """One change of the node table: eject the hosts that died, re-place what they served,
        restore and sweep the hosts that came back."""
        alive = set(agents.live_hosts(nodes))
        book = placement.read_book(self.fleetwide.settings.fleet_dir)
        serving = {h for placed in book.values() for h in placed.hosts}
        for host in sorted(serving - alive - self.down):
            self._eject(host, nodes)
        for host in sorted(self.down & alive):
            self._restore(host, nodes)
        for placed in book.values():
            if set(placed.hosts) - alive:
                self._recover(placed)

    def _eject(self, host: str, nodes: list[Node]) -> None:
        control = self.control()
        address = self._address(host, nodes)
        if control is not None and address is not None:
            control.eject_host(address)
        self.down.add(host)
        died = max((n.died_at for n in nodes if n.host == host and n.died_at), default=None)
        now = time.time()
        log.warning("fleet_host_ejected", host=host, address=address, died_at=died, ejected_at=now,
                    after_ray_s=round(now - died, 3) if died else None)
        self.bus.publish(Note("", f"fleet host {host} is down: its replicas are out of routing"))

    def _restore(self, host: str, nodes: list[Node]) -> None:
        try:
            strays = self.fleetwide.sweep(host, wait=self.wait)
        except SparkctlError as e:
            log.warning("fleet_host_sweep_failed", host=host, error=str(e))
            return  # stays down: tried again at the next change
        self.down.discard(host)
        control, address = self.control(), self._address(host, nodes)
        if control is not None and address is not None:
            control.restore_host(address)
        log.info("fleet_host_back", host=host, removed=strays)

    def _recover(self, placed: placement.Placed) -> None:
        started = time.monotonic()
        try:
            entry, failed = self.fleetwide.recover(placed, wait=self.wait, within=self.within)
        except SparkctlError as e:
            log.error("fleet_replace_failed", stack=placed.stack, error=str(e))
            return
        self.refresh()
        control = self.control()
        if control is not None:
            control.routes_changed()
        log.info("fleet_replaced", stack=placed.stack, hosts=entry.hosts, failed=failed,
                 seconds=round(time.monotonic() - started, 3))
        self.bus.publish(Note(placed.stack, f"{placed.stack} re-placed on {', '.join(entry.hosts)}"))

    def _address(self, host: str, nodes: list[Node]) -> str | None:
        """The host's serving address: the inventory's, else the one its node advertises."""
        fleet = self.fleetwide.fleet
        if fleet is not None and host in fleet.names:
            return fleet.host(host).serving.address
        return next((n.labels.get(LABEL_ADDRESS) for n in nodes if n.host == host), None)
