"""The daemon's watch over the fleet it heads: hosts Ray declares dead leave routing at once, the
stacks they served are re-placed, and a host that comes back is swept of what now runs elsewhere.

A child process reads Ray's node table every 0.1 s and reports each change (`FleetBackend.watch`).
When a host that serves placed stacks is no longer alive, the gateway ejects every replica on its
serving address in the same step, so requests go to the other replicas, or wait in the gateway's
hold while a stack has none; then each such stack is re-placed where Ray put its bundles and the
routes are rebuilt, which lets the held requests go. The time from Ray's verdict to the eject is
logged (`fleet_host_ejected`).

A second thread probes the placed engines (`fleetprobe.py`). Both threads re-place a stack only
while no other recovery of it runs, and each recovery runs in a thread of its own: a real
engine's start takes minutes, and meanwhile the node table is still watched (another host's
death, this host's return) and the other stacks still probed. Started by the daemon on a fleet's
head.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

import structlog

from sparkctl.daemon.events import EventBus
from sparkctl.daemon.fleetprobe import FleetProbe
from sparkctl.daemon.planner import Policy
from sparkctl.daemon.seam import GatewayFromThread
from sparkctl.errors import SparkctlError
from sparkctl.fleet import agents, placement
from sparkctl.fleet.deploy import Fleetwide
from sparkctl.messages import Note
from sparkctl.node import LABEL_ADDRESS, Node

log = structlog.get_logger()
RETRY = 1.0  # s before watching again after the head stopped answering


class FleetWatch(FleetProbe):
    def __init__(self, fleetwide: Fleetwide, *, control: GatewayFromThread,
                 refresh: Callable[[], None], bus: EventBus, wait: float, within: float,
                 served_name: Callable[[str], str] = str, policy: Policy = Policy(),
                 background: Callable[[Callable[[], object]], None] = lambda work: threading.Thread(
                     target=work, name="fleet-recover", daemon=True).start(),
                 clock: Callable[[], float] = time.time) -> None:
        self.fleetwide, self.control, self.refresh, self.bus = fleetwide, control, refresh, bus
        self.wait, self.within = wait, within  # an agent's deploy; Ray's re-placement
        self.served_name, self.policy = served_name, policy  # a stack's model name; crash loops and backoff
        self.background = background  # how a recovery runs beside the watch and the probes
        self.clock = clock  # epoch seconds, for the crash-loop window
        self.nodes: list[Node] | None = None  # Ray's node table as the watch last reported it
        self.down: set[str] = set()  # hosts taken out of routing
        self.failures: dict[str, tuple[float, ...]] = {}  # group, or stack@host -> its recent failures
        self.held_out: set[str] = set()  # rank-0 URLs a failed probe took out of routing
        self.asleep: set[str] = set()  # replica URLs out of routing while their engines sleep
        self.given_up: set[str] = set()  # groups and stack@host in a crash loop: probed, not acted on
        self.awaiting: set[str] = set()  # stack@host whose failure waits on Ray's verdict (logged once)
        self._recovering: dict[str, threading.Lock] = {}
        self._recovered: dict[str, float] = {}  # stack -> when its last recovery succeeded (monotonic)
        self._stopping = threading.Event()
        self._watch = None
        self._threads = [threading.Thread(target=self._run, name="fleet-watch", daemon=True),
                         threading.Thread(target=self._probe_groups, name="fleet-groups", daemon=True)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

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
        self.nodes = nodes
        alive = set(agents.live_hosts(nodes))
        book = placement.serving(placement.read_book(self.fleetwide.settings.fleet_dir))
        serving = {h for placed in book.values() for h in placed.hosts}
        for host in sorted(serving - alive - self.down):
            self._eject(host, nodes)
        for host in sorted(self.down & alive):
            self._restore(host, nodes)
        for placed in book.values():
            if set(placed.hosts) - alive:
                self._recover_later(placed)

    def _eject(self, host: str, nodes: list[Node]) -> None:
        address = self._address(host, nodes)
        if address is not None:
            self.control.eject_host(address)
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
        address = self._address(host, nodes)
        if address is not None:
            self.control.restore_host(address)
        log.info("fleet_host_back", host=host, removed=strays)

    def _recover_later(self, placed: placement.Placed) -> None:
        decided = time.monotonic()
        self.background(lambda: self._recover(placed, decided))

    def _recover(self, placed: placement.Placed, decided: float) -> bool:
        """Re-place the stack (a group: recreate it), unless a recovery of it already runs or
        one succeeded since this one was decided (`decided`, monotonic): the fault it answers
        is mended, and a second recreation would take the group down again unannounced."""
        lock = self._recovering.setdefault(placed.stack, threading.Lock())
        if not lock.acquire(blocking=False):
            return False
        started = time.monotonic()
        try:
            if self._recovered.get(placed.stack, -math.inf) > decided:
                return False
            if placed.ranks and placed.replicas:  # a group is out of routing while it is recreated, even
                self._hold_out(placed.replicas[0].url)  # if it answered again meanwhile (a link back up)
            done = self.fleetwide.recover(placed, wait=self.wait, within=self.within)
            self._recovered[placed.stack] = time.monotonic()
        except SparkctlError as e:
            log.error("fleet_replace_failed", stack=placed.stack, error=str(e))
            return False
        finally:
            lock.release()
        self.refresh()
        if placed.replicas and placed.replicas[0].url in self.held_out:  # the routes now say where rank 0 is
            self.held_out.discard(placed.replicas[0].url)
            self.control.restore_engine(placed.replicas[0].url)
        self.control.routes_changed()
        log.info("fleet_replaced", stack=placed.stack, hosts=done.entry.hosts, failed=done.failed,
                 seconds=round(time.monotonic() - started, 3), engine_s=done.engine_s)
        self.bus.publish(Note(placed.stack, f"{placed.stack} re-placed on {', '.join(done.entry.hosts)}"))
        return True

    def _recovering_now(self, stack: str) -> bool:
        lock = self._recovering.get(stack)
        return lock is not None and lock.locked()

    def _address(self, host: str, nodes: list[Node]) -> str | None:
        """The host's serving address: the inventory's, else the one its node advertises."""
        fleet = self.fleetwide.fleet
        if fleet is not None and host in fleet.names:
            return fleet.host(host).serving.address
        return next((n.labels.get(LABEL_ADDRESS) for n in nodes if n.host == host), None)
