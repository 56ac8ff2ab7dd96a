"""The head daemon's watch over the fleet (built by `daemon/app.py` on a fleet's head).

A child reads Ray's node table every 0.1 s and reports each change (`FleetBackend.watch`). A host
that serves placed stacks and is no longer alive leaves routing at once (the gateway ejects every
replica on its serving address, logged as `fleet_host_ejected` with the time from Ray's verdict),
each stack it served is re-placed where Ray put its bundles and the routes are rebuilt, which lets
the held requests go; a host that comes back is swept of what now runs elsewhere. Each probe pass
(every `PROBE_EVERY`) settles the book against the last table again, so an entry a `fleet up`
recorded on a host that died while it ran is re-placed too; then it probes the placed engines.
A replica whose `/health` fails on a live host is observed once (its host's agent lists its
containers; Ray's table is read before and after) and `fleet.triage` decides: it is started again
only on its live agent's word that its container is gone or exited, under the crash-loop rule; a
silent agent gets nothing (its host may be dying, issue 31): Ray's verdict decides. A multi-node
group's `/health` lies (issue 18), so its rank 0 gets a 1-token completion instead, and a failed
one has the group recreated whole. A recovery runs in a thread of its own (an engine's start takes
minutes), one per stack at a time, while the table is still watched and the others still probed.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from sparkctl.adapters import engine
from sparkctl.errors import SparkctlError
from sparkctl.fleet import agents, membership, placement, triage
from sparkctl.fleet.deploy import Fleetwide
from sparkctl.messages import Note
from sparkctl.node import LABEL_ADDRESS, AgentAnswer, Node

if TYPE_CHECKING:
    from sparkctl.daemon.events import EventBus
    from sparkctl.daemon.planner import Policy
    from sparkctl.daemon.seam import GatewayFromThread

log = structlog.get_logger()
RETRY = 1.0  # s before watching again after the head stopped answering
PROBE_EVERY = 1.0  # s between two probe passes
PROBE_TIMEOUT = 3.0  # s a 1-token completion may take before the group counts as hung
AGENT_WAIT = 5.0  # s a failing replica's host agent has to list its containers; silent: nothing is sent there
SERVING, ASLEEP, DOWN = "serving", "asleep", "down"  # a placed replica, as its probe finds it
AWAKE = re.compile(r'^vllm:engine_sleep_state\{[^}]*sleep_state="awake"[^}]*\}\s+([0-9.eE+-]+)', re.MULTILINE)


class FleetWatch:
    def __init__(self, fleetwide: Fleetwide, *, control: GatewayFromThread,
                 refresh: Callable[[], None], bus: EventBus, wait: float, within: float,
                 policy: Policy, backoff: Callable[[int], float], served_name: Callable[[str], str] = str,
                 background: Callable[[Callable[[], object]], None] = lambda work: threading.Thread(
                     target=work, name="fleet-recover", daemon=True).start(),
                 clock: Callable[[], float] = time.time) -> None:
        self.fleetwide, self.control, self.refresh, self.bus = fleetwide, control, refresh, bus
        self.wait, self.within = wait, within  # an agent's deploy; Ray's re-placement
        self.served_name, self.policy = served_name, policy  # a stack's model name; crash loops
        self.backoff = backoff  # the delay before a group's next recreation, by its failures so far
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
        """One change of the node table: restore and sweep the hosts that came back, eject the
        hosts that died and re-place what they served."""
        self.nodes = nodes
        for host in sorted(self.down & set(agents.live_hosts(nodes))):
            self._restore(host, nodes)
        self.settle(nodes)

    def settle(self, nodes: list[Node]) -> None:
        """The book against a node table: the hosts it places stacks on that are not alive leave
        routing, and those stacks are re-placed (unless a recovery of them runs)."""
        alive = set(agents.live_hosts(nodes))
        book = placement.serving(self.fleetwide.book.entries())
        serving = {h for placed in book.values() for h in placed.hosts}
        for host in sorted(serving - alive - self.down):
            self._eject(host, nodes)
        for placed in book.values():
            if set(placed.hosts) - alive and not self._recovering_now(placed.stack):
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
            if done is None:  # the book moved on meanwhile (a `fleet up` re-placed it, or it was taken down)
                log.info("fleet_replace_moot", stack=placed.stack)
                return False
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

    def auth(self) -> str:
        """The credential placed engines' relays ask for (read from the fleet's token each time:
        `fleet init` may write it after the daemon started)."""
        return membership.relay_auth(self.fleetwide.settings)

    def _probe_groups(self) -> None:
        while not self._stopping.wait(PROBE_EVERY):
            try:
                self.probe_pass()
            except Exception:  # noqa: BLE001 - the probes must outlive any one bad step
                log.exception("fleet_group_probe_failed")

    def probe_pass(self) -> None:
        """The book settled against the last node table (an entry recorded on a host that died
        meanwhile is re-placed), then every served stack probed once: each group's rank 0, then
        the single-host replicas."""
        if self.nodes is not None:
            self.settle(self.nodes)
        book = placement.serving(self.fleetwide.book.entries())
        for placed in book.values():
            if placed.ranks and placed.replicas and not self._recovering_now(placed.stack):
                self._probe(placed)
        self.check_replicas([placed for placed in book.values() if not placed.ranks])

    def check_replicas(self, stacks: list[placement.Placed]) -> None:
        """The replicas of `stacks` that fail `/health` on hosts not held out: observed once,
        decided on by `triage.decide`, acted on (a dead host is the node watch's)."""
        failing, auth = [], self.auth() if stacks else ""
        for placed in (p for p in stacks if not self._recovering_now(p.stack)):
            for replica in placed.replicas:
                state = None if replica.host in self.down else engine_state(replica.url, auth)
                self._route_awake(placed.stack, replica.url, asleep=state == ASLEEP)
                if state in (None, SERVING, ASLEEP):
                    self.given_up.discard(f"{placed.stack}@{replica.host}")
                else:
                    failing.append((placed, replica))
        if not failing:
            return
        seen, nodes = self._observe(failing)
        for (placed, _), one in zip(failing, seen, strict=True):
            self._act(placed, triage.decide(one, failures=self.failures.get(one.key, ()),
                                            given_up=one.key in self.given_up, now=self.clock(),
                                            crash_loop=self.policy.crash_loop, window=self.policy.window), nodes)

    def _observe(self, failing: list[tuple[placement.Placed, placement.Replica]]
                 ) -> tuple[list[triage.Seen], list[Node] | None]:
        """One observation of the failing replicas: Ray's table before, their live hosts' agents'
        container lists, Ray's table and the book after; and that last table."""
        before = self.nodes
        hosts = sorted({r.host for _, r in failing if triage.live_node(before, r.host)})
        answers = self._containers(hosts, before or []) if hosts else {}
        after = self.nodes
        book = self.fleetwide.book.entries()
        return [triage.Seen(placed.stack, r.host, r.url, placed=book.get(placed.stack) == placed,
                            down=r.host in self.down, node_before=triage.live_node(before, r.host),
                            node_after=triage.live_node(after, r.host), answer=answers.get(r.host))
                for placed, r in failing], after

    def _containers(self, hosts: list[str], nodes: list[Node]) -> dict[str, AgentAnswer]:
        try:
            answers = self.fleetwide.containers(hosts, wait=AGENT_WAIT, nodes=nodes)
        except SparkctlError as e:  # Ray's head did not carry the call: no agent was heard
            answers = [AgentAnswer(host=h, error=str(e)) for h in hosts]
        return {a.host: a for a in answers}

    def _act(self, placed: placement.Placed, decision: triage.Decision, nodes: list[Node] | None) -> None:
        seen = decision.seen
        if isinstance(decision, triage.Leave):
            self._await_ray(decision)
            return
        self.awaiting.discard(seen.key)
        self.failures[seen.key] = decision.failures
        if isinstance(decision, triage.GiveUp):
            self._give_up(seen.key, decision.failures)
            return
        log.warning("fleet_replica_down", stack=seen.stack, host=seen.host, url=seen.url, container=decision.state)
        try:
            self.fleetwide.restart(placed, seen.host, wait=self.wait, nodes=nodes or [])
        except SparkctlError as e:
            log.error("fleet_replica_restart_failed", stack=seen.stack, host=seen.host, error=str(e))
            return
        log.info("fleet_replica_restarted", stack=seen.stack, host=seen.host)
        self.control.restore_engine(seen.url)  # back in routing now, not after the gateway's own ejection

    def _await_ray(self, decision: triage.Leave) -> None:
        """Say once per episode that a failing replica's host goes unjudged until Ray's verdict."""
        seen = decision.seen
        if not decision.why.awaits_ray():
            self.awaiting.discard(seen.key)
            return
        if seen.key not in self.awaiting:
            self.awaiting.add(seen.key)
            log.warning("fleet_replica_awaits_ray", stack=seen.stack, host=seen.host, url=seen.url,
                        why=str(decision.why), error=seen.answer.error if seen.answer else None,
                        note="nothing is sent to that host until Ray declares it dead (the stack is "
                             "re-placed) or its agent answers again")

    def _probe(self, placed: placement.Placed) -> None:
        url = placed.replicas[0].url
        failed_at = time.time()
        why = probe(url, self.served_name(placed.stack), self.auth())
        if why is None:
            if self._recovering_now(placed.stack):  # a recreation runs: it puts the group back when done
                return
            if url in self.held_out:  # it answers again (or was brought up again)
                self.held_out.discard(url)
                self.control.restore_engine(url)
            self.given_up.discard(placed.stack)
            return
        if placed.stack in self.given_up:  # a crash loop: left out until it answers again
            return
        self._hold_out(url)
        log.warning("fleet_group_ejected", stack=placed.stack, url=url, why=why, failed_at=failed_at,
                    ejected_at=time.time())
        self.bus.publish(Note(placed.stack, f"{placed.stack}'s group failed its probe ({why}): recreating it"))
        if self._crash_loop(placed.stack):
            return
        self._stopping.wait(self.backoff(len(self.failures[placed.stack])))
        current = self.fleetwide.book.get(placed.stack)
        if current != placed:  # recovered meanwhile (its host died, say), or taken down: nothing to redo
            return
        if probe(url, self.served_name(placed.stack), self.auth()) is None:  # it came back by itself
            self._probe(placed)
            return
        self._recover_later(placed)

    def _crash_loop(self, key: str) -> bool:
        """Count one more failure of group `key`; True, and left alone from now on until it
        answers again, once the crash-loop rule says so."""
        recent, looping = triage.count_failure(self.failures.get(key, ()), now=self.clock(),
                                               crash_loop=self.policy.crash_loop, window=self.policy.window)
        self.failures[key] = recent
        if looping:
            self._give_up(key, recent)
        return looping

    def _give_up(self, key: str, failures: tuple[float, ...]) -> None:
        self.given_up.add(key)
        log.error("fleet_crash_loop", key=key, failures=len(failures),
                  note="left out of routing until it answers: `sparkctl fleet up` it again once fixed")

    def _hold_out(self, url: str) -> None:
        if url not in self.held_out:
            self.control.eject_engine(url)
            self.held_out.add(url)

    def _route_awake(self, stack: str, url: str, *, asleep: bool) -> None:
        """A placed engine asleep without the daemon's word (it parks placed stacks by removing
        them) is out of routing until it wakes: vLLM queues a sleeping engine's requests without an
        answer. It needs no restart: it is alive."""
        if asleep == (url in self.asleep):
            return
        if asleep:
            self.asleep.add(url)
            self.control.eject_engine(url)
            log.warning("fleet_replica_asleep", stack=stack, url=url, note="out of routing until it wakes")
        else:
            self.asleep.discard(url)
            self.control.restore_engine(url)
            log.info("fleet_replica_awake", stack=stack, url=url)


def probe(url: str, model: str, auth: str) -> str | None:
    """A 1-token completion at `url` within PROBE_TIMEOUT: None when it answered 200, else why not.
    `auth`: the fleet's relay credential (`membership.relay_auth`)."""
    body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
    try:
        status, _ = engine.call(url, "/v1/chat/completions", body=body, headers={"Authorization": auth},
                                timeout=PROBE_TIMEOUT)
        return None if status == 200 else f"status {status}"
    except OSError as e:
        return f"no answer within {PROBE_TIMEOUT:g} s" if isinstance(e, TimeoutError) else f"unreachable ({e})"


def engine_state(url: str, auth: str) -> str:
    """The engine at `url`: DOWN (no 200 from `/health` within PROBE_TIMEOUT), ASLEEP (its
    `/metrics` say `vllm:engine_sleep_state{sleep_state="awake"} 0`), else SERVING."""
    if engine.status(url, "/health", headers={"Authorization": auth}, timeout=PROBE_TIMEOUT) != 200:
        return DOWN
    try:
        awake = AWAKE.search(engine.text(url, "/metrics", headers={"Authorization": auth}, timeout=PROBE_TIMEOUT))
    except OSError:  # refused, reset, timed out, or an HTTP error status
        return DOWN
    return ASLEEP if awake is not None and float(awake[1]) == 0 else SERVING
