"""`sparkctl fleet up STACK` and `fleet down STACK`: a stack placed by Ray and deployed on each
chosen host by that host's agent, with the single-Spark pipeline.

Up: Ray places one bundle per replica (the stack's memory; its host, when named), or the stack is
refused with the fleet's free memory per host. Every chosen host prepares (pulls by digest,
fetches the weights' commit, patches) without starting; unless they all agree, nothing starts and
each host that differs is named. Then every host starts its engine, and the book records each
replica's URL for the gateway. Down removes the containers on every host (each host's Docker
confirms), releases the placement and drops the stack from the book. Park removes the engines
but keeps the placement, so waking starts them again where Ray has the stack's bundles.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sparkctl.errors import NoRoom, SparkctlError
from sparkctl.fleet import agents, placement
from sparkctl.fleet.backend import FleetBackend
from sparkctl.fleet.placement import Book, Placed, Replica
from sparkctl.node import AgentAnswer, AgentCall, Containers, Node, Prepare, Remove, Up, unreachable
from sparkctl.settings import Settings
from sparkctl.spec.fleet import Fleet
from sparkctl.spec.models import Stack
from sparkctl.spec.ranks import Rank, RankHost
from sparkctl.spec.render import spec_hash

PLACE_WAIT = 10.0  # s: a placement Ray can make is made within a second or two
REMOVE_WAIT = 10.0  # s a host's agent has to confirm a group's rank gone, before a recreation


@dataclass(frozen=True)
class Recovered:
    entry: Placed  # as the book has it now
    failed: dict[str, str]  # host -> why its replica did not start
    engine_s: float | None = None  # a recreated group's rank 0: its engine's own start (container to /health)


@dataclass(frozen=True)
class FleetUp:
    placed: Placed
    failed: dict[str, str]  # host -> why its engine did not start (its bundle stays reserved)
    notes: list[str]


@dataclass
class Fleetwide:
    """One fleet's control plane as the head's daemon uses it, with the book it owns."""

    backend: FleetBackend
    settings: Settings
    fleet: Fleet | None
    head: str
    book: Book

    _owners: dict[str, threading.Lock] = dataclasses.field(default_factory=dict)

    @contextlib.contextmanager
    def owning(self, stack: str) -> Iterator[None]:
        """One change of `stack`'s placement at a time (an `up`, `down`, park, wake or recovery),
        so a recovery decided on an entry that an `up` then replaced finds it moved."""
        with self._owners.setdefault(stack, threading.Lock()):
            yield

    def up(self, stack: Stack, *, total_bytes: int, wait: float,
           say: Callable[[str], None] = lambda _: None) -> FleetUp:
        with self.owning(stack.name):
            bundles, strategy = placement.bundles(stack, total_bytes)
            group = placement.group_name(stack.name)
            known = self.book.get(stack.name)
            if known is not None and len(known.hosts) != len(bundles):
                self._release(group)  # a new replica count is a new placement
            address = agents.driver_address(self.settings)
            try:
                placed = self.backend.place(self.head, local_address=address, name=group, bundles=bundles,
                                            strategy=strategy, wait=PLACE_WAIT)
            except NoRoom:
                raise NoRoom(placement.fits_nowhere(stack, bundles[0], self.free(), len(bundles))) from None
            nodes = self.backend.nodes(self.head)
            hosts = [_host_of(node_id, nodes) for node_id in placed.nodes]
            say(f"Ray placed {stack.name} on {', '.join(hosts)} ({strategy})")
            spec = spec_hash(stack)
            prepared = self._ask(hosts, Prepare(stack.name, spec), wait, nodes)
            agreement = placement.agree(prepared)
            if agreement.differences:
                self._release(group)
                raise SparkctlError(agreement.refusal(stack.name))
            say(f"every host holds image {agreement.expected['image'][:19]} and the same weights; starting")
            if stack.parallel is None:
                started = self._ask(hosts, Up(stack.name, spec, agreement.expected), wait, nodes)
                entry = Placed(stack.name, group, _replicas(started), spec, agreement.expected)
            else:
                started = self._start_group(stack.name, hosts, spec, agreement.expected, wait, nodes)
                entry = Placed(stack.name, group, _replicas(started[:1]), spec, agreement.expected, tuple(hosts))
            placed = self._record(entry)
            notes = [n for a in [*prepared, *started] if a.ok for n in a.value.notes]
            return FleetUp(placed, unreachable(started), notes)

    def _start_group(self, stack: str, hosts: list[str], spec: str, expected: dict[str, str], wait: float,
                     nodes: list[Node]) -> list[AgentAnswer]:
        """Every rank at once (rank 0 first in the answers), each with its own host's network
        settings; if any rank fails, every rank is removed, so no orphan is left behind."""
        ranks = group_ranks(self.fleet, hosts)
        started = self._ask(hosts, Up(stack, spec, expected, ranks), wait, nodes)
        if not all(a.ok for a in started):
            self._ask(hosts, Remove(stack), wait, nodes)
            failed = "; ".join(f"rank {hosts.index(a.host)} on {a.host}: {a.error}" for a in started if not a.ok)
            raise SparkctlError(f"{stack}'s group did not start, every rank removed: {failed}")
        return started

    def recreate(self, placed: Placed, hosts: list[str], *, wait: float, nodes: list[Node]) -> Recovered:
        """A multi-node group as one unit: every rank removed on every live host it ran on (an
        orphaned headless rank included), then the whole group started again on `hosts`. A
        host Ray still counts alive whose agent does not confirm the removal within REMOVE_WAIT
        (its link is down) fails the attempt at once: the next one finds it declared dead and
        the group re-placed by Ray, or answering again."""
        alive = set(agents.live_hosts(nodes))
        removed = self._ask([h for h in placed.ranks if h in alive], Remove(placed.stack), REMOVE_WAIT, nodes)
        if silent := [a for a in removed if not a.ok]:
            raise SparkctlError(f"{placed.stack}'s ranks could not be removed on "
                                + "; ".join(f"host {a.host} ({a.error})" for a in silent))
        started = self._start_group(placed.stack, hosts, placed.spec, placed.parts, wait, nodes)
        entry = self._record(dataclasses.replace(placed, replicas=_replicas(started[:1]), ranks=tuple(hosts)))
        return Recovered(entry, {}, started[0].value.timings.get("engine_start_s"))

    def recover(self, placed: Placed, *, wait: float, within: float) -> Recovered | None:
        """Replace the replicas whose host died, on the hosts where Ray re-placed their bundles,
        with what was agreed; the replicas on live hosts stay (a multi-node group is recreated
        whole). Returns the new entry (also in the book) and the hosts that failed to start theirs;
        None when the book no longer has `placed` (re-placed, parked or taken down meanwhile)."""
        with self.owning(placed.stack):
            if self.book.get(placed.stack) != placed:
                return None
            return self._recover(placed, wait=wait, within=within)

    def _recover(self, placed: Placed, *, wait: float, within: float) -> Recovered:
        hosts, alive, nodes = self._placed_on(placed, within)
        if placed.ranks:
            return self.recreate(placed, hosts, wait=wait, nodes=nodes)
        kept = tuple(r for r in placed.replicas if r.host in hosts and r.host in alive)
        new = [h for h in hosts if h not in {r.host for r in kept}]
        started = self._ask(new, Up(placed.stack, placed.spec, placed.parts), wait, nodes) if new else []
        entry = self._record(dataclasses.replace(placed, replicas=kept + _replicas(started)))
        return Recovered(entry, unreachable(started))

    def park(self, stack: str, *, wait: float, before: Callable[[], None] = lambda: None) -> Placed:
        """Remove the stack's engines on every host; its placement stays. Marked parked in the
        book first, so the head's daemon neither routes, probes nor restarts it meanwhile; then
        `before()` (its requests drain)."""
        with self.owning(stack):
            placed = self.book.change(lambda book: _parked(book, stack))[stack]
            before()
            removed = self._ask(placed.hosts, Remove(stack), wait, self.backend.nodes(self.head))
            if failed := [a for a in removed if not a.ok]:
                raise SparkctlError(f"{stack} is parked, but its engine is not confirmed gone on "
                                    + "; ".join(f"host {a.host} ({a.error})" for a in failed)
                                    + f"; `sparkctl park {stack}` again removes it there")
            return placed

    def wake(self, stack: str, *, wait: float, within: float) -> Recovered:
        """Start a parked stack's engines again with what was agreed, where Ray has its bundles
        now (a host that died meanwhile had them re-placed); a group starts whole."""
        with self.owning(stack):
            placed = self.book.get(stack)
            if placed is None or not placed.parked:
                raise SparkctlError(f"{stack} is not parked across the fleet")
            hosts, _, nodes = self._placed_on(placed, within)
            if placed.ranks:
                started = self._start_group(stack, hosts, placed.spec, placed.parts, wait, nodes)
                replicas, ranks = _replicas(started[:1]), tuple(hosts)
            else:
                started = self._ask(hosts, Up(stack, placed.spec, placed.parts), wait, nodes)
                replicas, ranks = _replicas(started), ()
            if not replicas:
                raise SparkctlError(f"{stack} woke on no host: " + "; ".join(f"{a.host}: {a.error}" for a in started))
            entry = self._record(dataclasses.replace(placed, replicas=replicas, ranks=ranks, parked=False))
            return Recovered(entry, unreachable(started),
                             started[0].value.timings.get("engine_start_s") if started[0].ok else None)

    def _placed_on(self, placed: Placed, within: float) -> tuple[list[str], set[str], list[Node]]:
        """Where Ray has the stack's bundles, once every one of them is on a live host (within
        `within` s): those hosts, the live ones, and the node table."""
        address = agents.driver_address(self.settings)
        deadline = time.monotonic() + within
        while True:
            now = self.backend.placement(self.head, local_address=address, name=placed.group)
            if now is None:
                raise SparkctlError(f"{placed.stack}'s placement {placed.group} is gone from Ray; run "
                                    f"`sparkctl fleet up {placed.stack}` again")
            nodes = self.backend.nodes(self.head)
            alive = set(agents.live_hosts(nodes))
            hosts = [_host_of(node_id, nodes) for node_id in now.nodes if node_id]
            if now.placed and set(hosts) <= alive:
                return hosts, alive, nodes
            if time.monotonic() > deadline:
                raise SparkctlError(f"Ray has not re-placed {placed.stack} within {within:g} s (no live host has "
                                    f"{placed.stack}'s memory free); it stays held at the gateway")
            time.sleep(0.2)

    def restart(self, placed: Placed, host: str, *, wait: float, nodes: list[Node]) -> None:
        """Start a placed stack's replica again on `host`, with what was agreed (its engine
        died while the host lives: the host's own daemon does not restart the fleet's containers).
        `nodes`: Ray's table as the caller observed it when the host's agent reported the engine gone."""
        (answer,) = self._ask([host], Up(placed.stack, placed.spec, placed.parts), wait, nodes)
        if not answer.ok:
            raise SparkctlError(f"{placed.stack} did not start again on host {host}: {answer.error}")

    def containers(self, hosts: list[str], *, wait: float, nodes: list[Node]) -> list[AgentAnswer]:
        """What each host's agent lists (the instance's containers, with Docker's state), one
        answer per host: an error for a host Ray does not list alive in `nodes` or whose agent
        did not answer within `wait`."""
        return self._ask(hosts, Containers(), wait, nodes)

    def sweep(self, host: str, *, wait: float) -> list[str]:
        """Remove the fleet's containers on `host` that the book does not place there (a host that
        comes back restarts what it ran before it died, which now runs elsewhere); their stacks."""
        (listed,) = self._ask([host], Containers(), wait, self.backend.nodes(self.head))
        if not listed.ok:
            raise SparkctlError(f"host {host} did not list its containers: {listed.error}")
        serving = placement.serving(self.book.entries())
        strays = sorted({c.stack for c in listed.value if c.placed
                         and host not in (serving[c.stack].hosts if c.stack in serving else [])})
        for stack in strays:
            self._ask([host], Remove(stack), wait, self.backend.nodes(self.head))
        return strays

    def down(self, stack: str, *, wait: float) -> list[AgentAnswer]:
        """Remove the stack's containers on every host. Its book entry goes first, so the head's
        daemon stops restarting what is being removed; the placement goes once every host
        confirmed (a retry asks every host again and releases it)."""
        with self.owning(stack):
            self.book.change(lambda book: book.pop(stack, None))
            answers = agents.ask(self.backend, head=self.head, settings=self.settings, fleet=self.fleet,
                                 call=Remove(stack), wait=wait)
            if all(a.ok for a in answers):
                self._release(placement.group_name(stack))
            return answers

    def free(self) -> dict[str, int]:
        """Each live host's free memory as Ray accounts it (its ceiling less what is placed)."""
        nodes = self.backend.nodes(self.head)
        free = self.backend.free_memory(self.head, local_address=agents.driver_address(self.settings))
        return {n.host: free[n.node_id] for n in nodes if n.host and n.state.is_up() and n.node_id in free}

    def _ask(self, hosts: list[str], call: AgentCall, wait: float, nodes: list[Node]) -> list[AgentAnswer]:
        return agents.ask(self.backend, head=self.head, settings=self.settings, fleet=self.fleet, call=call,
                          wait=wait, only=hosts, nodes=nodes)

    def _record(self, placed: Placed) -> Placed:
        self.book.change(lambda book: book.update({placed.stack: placed}))
        return placed

    def _release(self, group: str) -> None:
        self.backend.remove(self.head, local_address=agents.driver_address(self.settings), name=group)


def group_ranks(fleet: Fleet | None, hosts: list[str]) -> dict[str, dict]:
    """Each host's rank of a group (rank r on hosts[r]), as its agent takes it."""
    if fleet is None:
        raise SparkctlError("a multi-node stack needs the fleet file: each rank's interface and address come "
                            "from its host's `serving` entry")
    return {name: dataclasses.asdict(rank_on(fleet, hosts, index)) for index, name in enumerate(hosts)}


def rank_on(fleet: Fleet, hosts: list[str], index: int) -> Rank:
    """Rank `index` of a group on `hosts` (by rank): rank 0's serving address as the master, and
    the rank's own host's serving interface, address and RDMA device."""
    serving = fleet.host(hosts[index]).serving
    host = RankHost(hosts[index], serving.interface, serving.address, serving.hca)
    return Rank(index, fleet.host(hosts[0]).serving.address, host)


def _parked(book: dict[str, Placed], stack: str) -> None:
    if stack not in book:
        raise SparkctlError(f"{stack} is not placed across the fleet (`sparkctl fleet ps` lists what is)")
    book[stack] = dataclasses.replace(book[stack], parked=True)


def _replicas(started: list[AgentAnswer]) -> tuple[Replica, ...]:
    return tuple(Replica(a.host, a.value.url, a.value.fingerprint) for a in started if a.ok)


def _host_of(node_id: str, nodes: list[Node]) -> str:
    for node in nodes:
        if node.node_id == node_id and node.host:
            return node.host
    raise SparkctlError(f"Ray placed a bundle on node {node_id[:8]}, which is not a sparkctl host")
