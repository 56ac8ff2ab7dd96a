"""The daemon's watch over the fleet, one node table at a time: a host that dies while it serves a
placed stack leaves routing once (by its serving address) and the stack is re-placed; a host that
comes back is swept, then restored; a dead host that serves nothing is left alone. A multi-node
group that fails its probe is held out and recreated, until the crash-loop rule leaves it out; a
probe that passes brings it back. A replica whose engine died is started again on its host only
on its host agent's word that the container is gone or exited; an agent that does not answer gets
nothing until Ray's verdict (issue 31). Against a recording control plane and gateway control, with
an injected clock; the watch's threads are not started."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from sparkctl.adapters.placements import PlacementFile
from sparkctl.daemon.events import EventBus
from sparkctl.daemon.planner import Policy, backoff
from sparkctl.errors import SparkctlError
from sparkctl.fleet import local, membership, triage
from sparkctl.fleet import watch as probes
from sparkctl.fleet.deploy import Fleetwide, Recovered
from sparkctl.fleet.placement import Book, Placed, Replica
from sparkctl.fleet.watch import FleetWatch
from sparkctl.node import LABEL_ADDRESS, LABEL_HOST, AgentAnswer, HostContainer, Node, NodeState
from sparkctl.settings import Settings
from sparkctl.spec.fleet import Fleet, load_fleet

FLEET = "head: a\nhosts:\n" + "".join(f"""  - name: {n}
    serving: {{interface: enp1s0f0np0, address: 10.0.0.{i + 2}}}
    memory: 100GiB
    ray: {{address: 10.0.0.{i + 2}}}
""" for i, n in enumerate("abc"))
NOW = 1_000_000.0  # the watch's clock: the crash-loop window is counted on it, never on the wall
GEMMA = Placed(stack="gemma", group="stack-gemma", spec="0123456789abcdef", parts={"image": "sha256:1"},
               replicas=(Replica("a", "http://10.0.0.2:8110", "fp"), Replica("b", "http://10.0.0.3:8110", "fp")))


class Recorder:
    """The control plane (`Fleetwide`) and the gateway's `GatewayFromThread`, writing every call to one log."""

    def __init__(self, settings: Settings, fleet: Fleet | None) -> None:
        self.settings, self.fleet, self.backend, self.head = settings, fleet, None, "10.0.0.2:6379"
        self.book = Book(PlacementFile(settings.fleet_dir))
        self.calls: list[tuple] = []
        self.sweep_fails = False
        self.listing: dict[str, AgentAnswer] = {}  # host -> its agent's containers() answer (default: none listed)
        self.while_asked: Callable[[], None] = lambda: None  # what happens elsewhere while the agents are asked

    # Fleetwide
    def recover(self, placed: Placed, *, wait: float, within: float) -> Recovered | None:
        self.calls.append(("recover", placed.stack, wait, within))
        return Recovered(placed, {}) if self.book.get(placed.stack) == placed else None

    def restart(self, placed: Placed, host: str, *, wait: float, nodes: list[Node]) -> None:
        self.calls.append(("restart", placed.stack, host))

    def containers(self, hosts: list[str], *, wait: float, nodes: list[Node]) -> list[AgentAnswer]:
        self.calls.append(("containers", tuple(hosts)))
        self.while_asked()
        answers = [self.listing.get(h, AgentAnswer(h, value=[])) for h in hosts]
        if any(isinstance(a, Exception) for a in answers):
            raise next(a for a in answers if isinstance(a, Exception))
        return answers

    def sweep(self, host: str, *, wait: float) -> list[str]:
        self.calls.append(("sweep", host, wait))
        if self.sweep_fails:
            raise SparkctlError(f"the agent on {host} did not answer")
        return []

    # GatewayFromThread
    def eject_host(self, address: str) -> None:
        self.calls.append(("eject_host", address))

    def restore_host(self, address: str) -> None:
        self.calls.append(("restore_host", address))

    def routes_changed(self) -> None:
        self.calls.append(("routes_changed",))

    def eject_engine(self, url: str) -> None:
        self.calls.append(("eject_engine", url))

    def restore_engine(self, url: str) -> None:
        self.calls.append(("restore_engine", url))

    def named(self, *names: str) -> list[tuple]:
        return [c for c in self.calls if c[0] in names]


def write_book(recorder: Recorder, book: dict[str, Placed]) -> None:
    """The book as its owner (the daemon) holds it, replaced whole."""
    recorder.book.change(lambda entries: (entries.clear(), entries.update(book)))


def node(host: str, state: NodeState = NodeState.ALIVE, node_id: str = "", **labels: str) -> Node:
    return Node(node_id=node_id or host * 8, address="10.0.0.9", state=state, labels={LABEL_HOST: host, **labels},
                died_at=time.time() - 0.5 if state is NodeState.DEAD else None)


def table(dead: str = "", **labels: str) -> list[Node]:
    return [node(h, NodeState.DEAD if h == dead else NodeState.ALIVE, **labels) for h in "abc"]


@pytest.fixture
def watched(tmp_path: Path) -> tuple[FleetWatch, Recorder, EventBus]:
    settings = Settings(state_dir=tmp_path, instance="t1")
    (tmp_path / "fleet.yaml").write_text(FLEET)
    recorder, bus = Recorder(settings, load_fleet(tmp_path / "fleet.yaml")), EventBus()
    write_book(recorder, {"gemma": GEMMA})
    local.ensure_token(membership.token_path(settings))  # the fleet's token: placed engines' relays ask for it
    watch = FleetWatch(recorder, control=recorder, refresh=lambda: recorder.calls.append(("refresh",)),
                       bus=bus, wait=30.0, within=12.0, policy=Policy(),
                       backoff=lambda failures: backoff(failures, watch.policy), background=lambda work: work(),
                       clock=lambda: NOW)
    watch.nodes = table()
    return watch, recorder, bus


def test_a_dead_serving_host_is_ejected_by_its_serving_address_and_its_stack_re_placed(watched) -> None:
    watch, recorder, bus = watched
    watch.on_nodes(table())
    assert recorder.calls == [] and watch.down == set()
    watch.on_nodes(table(dead="b"))
    assert recorder.calls == [("eject_host", "10.0.0.3"), ("recover", "gemma", 30.0, 12.0), ("refresh",),
                              ("routes_changed",)]
    assert watch.down == {"b"}
    texts = [e["text"] for e in asyncio.run(bus.wait_after(0, timeout=0))]
    assert texts == ["fleet host b is down: its replicas are out of routing", "gemma re-placed on a, b"]


def test_the_same_node_table_again_does_not_eject_again(watched) -> None:
    watch, recorder, _ = watched
    watch.on_nodes(table(dead="b"))
    watch.on_nodes(table(dead="b"))
    assert recorder.named("eject_host") == [("eject_host", "10.0.0.3")]


def test_a_host_that_comes_back_is_swept_then_restored(watched) -> None:
    watch, recorder, _ = watched
    watch.on_nodes(table(dead="b"))
    recorder.calls.clear()
    watch.on_nodes(table())
    assert recorder.calls == [("sweep", "b", 30.0), ("restore_host", "10.0.0.3")]
    assert watch.down == set()
    watch.on_nodes(table())
    assert recorder.named("sweep", "restore_host") == [("sweep", "b", 30.0), ("restore_host", "10.0.0.3")]


def test_a_host_whose_sweep_fails_stays_out_of_routing_until_a_sweep_succeeds(watched) -> None:
    watch, recorder, _ = watched
    watch.on_nodes(table(dead="b"))
    recorder.calls.clear()
    recorder.sweep_fails = True
    watch.on_nodes(table())
    assert recorder.calls == [("sweep", "b", 30.0)] and watch.down == {"b"}
    recorder.sweep_fails = False
    watch.on_nodes(table())
    assert recorder.calls[-1] == ("restore_host", "10.0.0.3") and watch.down == set()


def test_a_dead_host_that_serves_nothing_is_not_ejected(watched) -> None:
    watch, recorder, bus = watched
    watch.on_nodes(table(dead="c"))
    assert recorder.calls == [] and watch.down == set() and bus.last == 0
    watch.on_nodes(table())
    assert recorder.calls == []  # nor swept when it is back


def test_without_an_inventory_the_address_its_node_advertises_is_ejected(watched) -> None:
    watch, recorder, _ = watched
    recorder.fleet = None
    watch.on_nodes(table(dead="a", **{LABEL_ADDRESS: "10.9.9.9"}))
    assert recorder.named("eject_host") == [("eject_host", "10.9.9.9")] and watch.down == {"a"}


DUO = Placed(stack="duo", group="stack-duo", spec="0123456789abcdef", parts={"image": "sha256:1"},
             replicas=(Replica("a", "http://10.0.0.2:8901", "fp"),), ranks=("a", "b"))


def test_a_group_that_fails_its_probe_is_held_out_and_recreated_until_a_crash_loop(
        watched, monkeypatch: pytest.MonkeyPatch) -> None:
    watch, recorder, _ = watched
    watch.policy = Policy(crash_loop=3, window=600, backoff_base=0, backoff_max=0)
    write_book(watch.fleetwide, {"duo": DUO})
    answers = {"why": "status 500"}
    monkeypatch.setattr(probes, "probe", lambda url, model, auth: answers["why"])
    for _ in range(4):
        watch._probe(DUO)
    url = "http://10.0.0.2:8901"
    assert recorder.named("eject_engine") == [("eject_engine", url)] * 3  # the fourth is not acted on
    assert recorder.named("recover") == [("recover", "duo", 30.0, 12.0)] * 2  # the third failure gives up
    assert watch.given_up == {"duo"}
    answers["why"] = None
    watch._probe(DUO)  # it answers again (brought up by hand): back in routing, no longer given up
    assert recorder.calls[-1] == ("restore_engine", url) and watch.given_up == set()


def test_a_group_recovered_meanwhile_is_not_recreated_again(watched, monkeypatch: pytest.MonkeyPatch) -> None:
    watch, recorder, _ = watched
    watch.policy = Policy(crash_loop=5, window=600, backoff_base=0, backoff_max=0)
    write_book(watch.fleetwide, {"duo": DUO})
    moved = dataclasses.replace(DUO, ranks=("a", "c"))

    def failing(url: str, model: str, auth: str) -> str:
        write_book(watch.fleetwide, {"duo": moved})  # its host died: the watch re-placed it
        return "no answer within 3 s"

    monkeypatch.setattr(probes, "probe", failing)
    watch._probe(DUO)
    assert recorder.named("eject_engine") and not recorder.named("recover")


def listed(host: str, *states: str, stack: str = "gemma") -> AgentAnswer:
    """Host `host`'s agent answering `containers()` with one container of `stack` per state."""
    return AgentAnswer(host, value=[HostContainer(host=host, stack=stack, name=f"sparkctl-{stack}", state=state,
                                                  image="", placed=True) for state in states])


SILENT = AgentAnswer("b", error="its agent did not answer within 5 s (host down, or Ray has not seen it back)")
B_DOWN = {"http://10.0.0.2:8110": True, "http://10.0.0.3:8110": False}  # gemma's replica on b fails /health


def test_a_dead_replica_on_a_live_host_is_started_there_again_until_a_crash_loop(
        watched, monkeypatch: pytest.MonkeyPatch) -> None:
    watch, recorder, _ = watched
    watch.policy = Policy(crash_loop=3, window=600, backoff_base=0, backoff_max=0)
    alive = dict(B_DOWN)
    monkeypatch.setattr(probes, "engine_state", lambda url, auth: state(alive[url]))
    recorder.listing = {"b": listed("b", "exited")}
    with capture_logs() as logs:
        for _ in range(4):
            watch.check_replicas([GEMMA])
    assert recorder.named("containers", "restart") == [("containers", ("b",)), ("restart", "gemma", "b")] * 2 + \
        [("containers", ("b",))] * 2  # the third failure is a crash loop; the fourth is left alone
    assert recorder.named("restore_engine") == [("restore_engine", "http://10.0.0.3:8110")] * 2
    assert watch.given_up == {"gemma@b"}
    assert [e["container"] for e in logs if e["event"] == "fleet_replica_down"] == ["exited", "exited"]
    alive["http://10.0.0.3:8110"] = True
    watch.check_replicas([GEMMA])
    assert watch.given_up == set()


def state(healthy: bool) -> str:
    return probes.SERVING if healthy else probes.DOWN


def test_a_replica_asleep_without_the_daemons_word_is_out_of_routing_until_it_wakes(
        watched, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31: real vLLM queues a sleeping engine's requests without an answer, so the gateway
    cannot see it; the probe does (`vllm:engine_sleep_state`). Alive, it is neither restarted nor
    counted as a failure."""
    watch, recorder, _ = watched
    states = {"http://10.0.0.2:8110": probes.SERVING, "http://10.0.0.3:8110": probes.ASLEEP}
    monkeypatch.setattr(probes, "engine_state", lambda url, auth: states[url])
    with capture_logs() as logs:
        watch.check_replicas([GEMMA])
        watch.check_replicas([GEMMA])  # still asleep: ejected once
        states["http://10.0.0.3:8110"] = probes.SERVING
        watch.check_replicas([GEMMA])
    assert recorder.named("eject_engine", "restore_engine", "restart", "containers") == [
        ("eject_engine", "http://10.0.0.3:8110"), ("restore_engine", "http://10.0.0.3:8110")]
    assert [e["event"] for e in logs if e["event"].startswith("fleet_replica")] == ["fleet_replica_asleep",
                                                                                   "fleet_replica_awake"]


@pytest.mark.parametrize("engine, metrics, expected", [
    ("serving", 'vllm:engine_sleep_state{model_name="m",sleep_state="awake"} 1.0\n', "serving"),
    ("asleep", 'vllm:engine_sleep_state{model_name="m",sleep_state="awake"} 0.0\n'
               'vllm:engine_sleep_state{model_name="m",sleep_state="weights_offloaded"} 1.0\n', "asleep"),
    ("no sleep mode", "vllm:num_requests_running 0\n", "serving"),
])
def test_engine_state_reads_health_then_the_sleep_gauge(engine: str, metrics: str, expected: str) -> None:
    del engine
    server = _Pages({"/health": "", "/metrics": metrics})
    try:
        assert probes.engine_state(server.url, "Bearer k") == expected
        assert server.seen == ["Bearer k", "Bearer k"]  # the relay's credential on each
    finally:
        server.close()
    assert probes.engine_state(server.url, "Bearer k") == probes.DOWN  # closed: refused


class _Pages:
    """A loopback HTTP server answering GETs from `pages` (path -> body), recording each Authorization."""

    def __init__(self, pages: dict[str, str]) -> None:
        import http.server
        import threading

        seen: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                seen.append(self.headers.get("Authorization", ""))
                body = pages.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                self.wfile.write((body or "").encode())

            def log_message(self, *_args: object) -> None:
                pass

        self.seen = seen
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


@pytest.mark.parametrize("silence", [SILENT, SparkctlError("Ray agents against 10.0.0.2:6379 did not answer in 45 s")],
                         ids=["agent_times_out", "call_raises"])
def test_a_failing_replica_whose_agent_is_silent_gets_nothing_until_rays_verdict(
        watched, monkeypatch: pytest.MonkeyPatch, silence: AgentAnswer | Exception) -> None:
    """Issue 31: a host being killed fails its replicas' /health before Ray declares it dead. Its
    agent cannot answer, so nothing is restarted there, however many passes run meanwhile; Ray's
    verdict then moves the stack elsewhere, and the dead host is not even asked any more."""
    watch, recorder, _ = watched
    monkeypatch.setattr(probes, "engine_state", lambda url, auth: state(B_DOWN[url]))
    recorder.listing = {"b": silence}
    with capture_logs() as logs:
        for _ in range(3):  # Ray still lists b alive
            watch.check_replicas([GEMMA])
        watch.on_nodes(table(dead="b"))  # Ray's verdict
        watch.check_replicas([GEMMA])
    assert recorder.named("containers", "restart", "eject_host", "recover") == [("containers", ("b",))] * 3 + [
        ("eject_host", "10.0.0.3"), ("recover", "gemma", 30.0, 12.0)]
    events = [e["event"] for e in logs]
    assert "fleet_replica_down" not in events and "fleet_replica_restarted" not in events
    (awaits,) = [e for e in logs if e["event"] == "fleet_replica_awaits_ray"]  # once, not once per pass
    assert awaits["host"] == "b" and awaits["why"] == "agent_unreachable" and awaits["error"]
    assert watch.failures == {} and watch.given_up == set()  # no restart was tried: no crash-loop count


def test_a_host_whose_agent_answers_again_is_decided_on_from_its_answer(
        watched, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray kept b alive (a slow agent, a link back up): once its agent answers that the container
    exited, the replica is started again there, and a later silence is logged anew."""
    watch, recorder, _ = watched
    monkeypatch.setattr(probes, "engine_state", lambda url, auth: state(B_DOWN[url]))
    recorder.listing = {"b": SILENT}
    with capture_logs() as logs:
        watch.check_replicas([GEMMA])
        recorder.listing = {"b": listed("b", "exited")}
        watch.check_replicas([GEMMA])
        recorder.listing = {"b": SILENT}
        watch.check_replicas([GEMMA])
    assert recorder.named("restart") == [("restart", "gemma", "b")]
    assert [e["event"] for e in logs if e["event"].startswith("fleet_replica")] == [
        "fleet_replica_awaits_ray", "fleet_replica_down", "fleet_replica_restarted", "fleet_replica_awaits_ray"]


@pytest.mark.parametrize("meanwhile", ["declared_dead", "rejoined"])
def test_a_late_answer_after_rays_table_changed_for_the_host_sends_nothing(
        watched, monkeypatch: pytest.MonkeyPatch, meanwhile: str) -> None:
    """The agent's answer comes after Ray declared its node dead (or after the host rejoined as a
    new node): it speaks for a host the node watch now owns, so no restart follows it."""
    watch, recorder, _ = watched
    monkeypatch.setattr(probes, "engine_state", lambda url, auth: state(B_DOWN[url]))
    recorder.listing = {"b": listed("b", "exited")}
    rejoined = [node("a"), node("b", NodeState.DEAD), node("b", node_id="bbbbnew1"), node("c")]
    now = table(dead="b") if meanwhile == "declared_dead" else rejoined
    recorder.while_asked = lambda: setattr(watch, "nodes", now)
    watch.check_replicas([GEMMA])
    assert recorder.named("restart") == []


def test_a_replica_on_a_dead_host_is_the_node_watchs(watched, monkeypatch: pytest.MonkeyPatch) -> None:
    watch, recorder, _ = watched
    monkeypatch.setattr(probes, "engine_state", lambda url, auth: state(False))
    watch.down.add("b")
    watch.nodes = table(dead="b")
    recorder.listing = {"a": listed("a", "running")}
    watch.check_replicas([GEMMA])
    assert recorder.named("containers", "restart") == [("containers", ("a",))]  # b is not even asked


def test_a_replica_moved_while_its_agent_was_asked_is_not_restarted(watched, monkeypatch: pytest.MonkeyPatch) -> None:
    watch, recorder, _ = watched
    monkeypatch.setattr(probes, "engine_state", lambda url, auth: state(B_DOWN[url]))
    recorder.listing = {"b": listed("b", "exited")}
    recorder.while_asked = lambda: write_book(watch.fleetwide, {})  # `fleet down gemma`
    watch.check_replicas([GEMMA])
    assert recorder.named("restart") == []


SEEN = triage.Seen("gemma", "b", "http://10.0.0.3:8110", placed=True, down=False, node_before="bbbbbbbb",
                   node_after="bbbbbbbb", answer=listed("b", "exited"))


@pytest.mark.parametrize(("change", "given_up", "failures", "expected"), [
    ({}, False, (), triage.Restart(SEEN, "exited", (NOW,))),
    ({"answer": listed("b")}, False, (), triage.Restart(dataclasses.replace(SEEN, answer=listed("b")), "gone", (NOW,))),
    ({"answer": listed("b", "dead", "created")}, False, (), "Restart"),
    ({"answer": listed("b", "exited", "running")}, False, (), triage.Why.RUNNING),
    ({"answer": listed("b", "restarting")}, False, (), triage.Why.RUNNING),
    ({"answer": listed("b", "running", stack="other")}, False, (), "Restart"),  # another stack's runs: gemma's is gone
    ({"answer": SILENT}, False, (), triage.Why.UNREACHABLE),
    ({"answer": AgentAnswer("b", error="docker: connection refused")}, False, (), triage.Why.UNREACHABLE),
    ({"answer": None}, False, (), triage.Why.UNREACHABLE),
    ({"node_after": "bbbbnew1"}, False, (), triage.Why.NODE_CHANGED),
    ({"node_after": None}, False, (), triage.Why.HOST_DOWN),
    ({"node_before": None, "answer": None}, False, (), triage.Why.HOST_DOWN),
    ({"down": True}, False, (), triage.Why.HOST_DOWN),
    ({"placed": False}, False, (), triage.Why.MOVED),
    ({}, True, (), triage.Why.GIVEN_UP),
    ({}, False, (NOW - 10, NOW - 5), triage.GiveUp(SEEN, (NOW - 10, NOW - 5, NOW))),  # the third in the window
    ({}, False, (NOW - 700, NOW - 5), triage.Restart(SEEN, "exited", (NOW - 5, NOW))),  # one fell out of it
])
def test_a_failing_replica_is_restarted_only_on_its_live_agents_word(
        change: dict, given_up: bool, failures: tuple, expected: object) -> None:
    seen = dataclasses.replace(SEEN, **change)
    decision = triage.decide(seen, failures=failures, given_up=given_up, now=NOW, crash_loop=3, window=600)
    if isinstance(expected, triage.Why):
        assert decision == triage.Leave(seen, expected)
    elif isinstance(expected, str):
        assert type(decision).__name__ == expected
    else:
        assert decision == expected
    if expected is triage.Why.UNREACHABLE:
        assert expected.awaits_ray()


def test_a_parked_stack_is_neither_ejected_nor_recovered_when_its_host_dies(watched) -> None:
    watch, recorder, _ = watched
    write_book(watch.fleetwide, {"gemma": dataclasses.replace(GEMMA, parked=True)})
    watch.on_nodes(table(dead="b"))
    assert recorder.calls == [] and watch.down == set()  # nothing runs there: Ray moves its bundle, a wake follows it


def test_a_recovery_runs_beside_the_watch_so_a_host_that_returns_meanwhile_is_restored(watched) -> None:
    watch, recorder, _ = watched
    pending: list = []
    watch.background = pending.append  # a real engine's start takes minutes: held here until run
    watch.on_nodes(table(dead="b"))
    assert recorder.named("recover") == [] and len(pending) == 1
    watch.on_nodes(table())  # b is back while its stack's recovery still runs
    assert recorder.named("sweep", "restore_host") == [("sweep", "b", 30.0), ("restore_host", "10.0.0.3")]
    pending[0]()
    assert recorder.named("recover") == [("recover", "gemma", 30.0, 12.0)]


def test_a_recovery_decided_before_another_one_succeeded_does_nothing(watched) -> None:
    """Node-table changes while a host is down each ask for the stack's recovery; once one has
    mended it, those still queued must not recreate the group again."""
    watch, recorder, _ = watched
    pending: list = []
    watch.background = pending.append
    watch.on_nodes(table(dead="b"))
    watch.on_nodes(table(dead="b", **{LABEL_ADDRESS: "10.9.9.9"}))  # another change, b still dead
    assert len(pending) == 2
    pending[0]()
    pending[1]()
    assert recorder.named("recover") == [("recover", "gemma", 30.0, 12.0)]


def test_a_group_being_recreated_stays_out_of_routing_though_it_answers_again(
        watched, monkeypatch: pytest.MonkeyPatch) -> None:
    """A link back up lets the old group answer while the node watch recreates it (its host was
    declared dead): the recreation holds rank 0 out, and a passing probe does not put it back."""
    watch, recorder, _ = watched
    write_book(watch.fleetwide, {"duo": DUO})
    monkeypatch.setattr(probes, "probe", lambda url, model, auth: None)
    inside = []

    def recover(placed, *, wait, within):
        watch._probe(DUO)  # the probe thread, meanwhile: the old group answers
        inside.append(list(recorder.named("eject_engine", "restore_engine")))
        return Recovered(placed, {})

    recorder.recover = recover
    watch.on_nodes(table(dead="b"))
    assert inside == [[("eject_engine", "http://10.0.0.2:8901")]]
    assert recorder.named("eject_engine", "restore_engine")[-1] == ("restore_engine", "http://10.0.0.2:8901")


def test_an_entry_recorded_on_a_host_that_died_meanwhile_is_re_placed_at_the_next_probe_pass(
        watched, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `fleet up` placed gemma on b and recorded it after the node watch saw b die: no node
    table changes again, so the probe pass settles the book against the last table."""
    watch, recorder, _ = watched
    monkeypatch.setattr(probes, "engine_state", lambda url, auth: probes.SERVING)
    write_book(recorder, {})
    watch.on_nodes(table(dead="b"))
    assert recorder.calls == []  # b served nothing when it died
    write_book(recorder, {"gemma": GEMMA})  # the `fleet up` that raced b's death records its entry
    watch.probe_pass()
    assert recorder.named("eject_host", "recover") == [("eject_host", "10.0.0.3"), ("recover", "gemma", 30.0, 12.0)]
    assert watch.down == {"b"}


def test_a_recovery_waits_for_an_up_of_its_stack_and_then_finds_its_entry_moved(tmp_path: Path) -> None:
    """The head's daemon changes a stack's placement one change at a time: a recovery decided on
    gemma's old entry waits while a `fleet up` of gemma runs, then finds the book moved on and
    leaves it (it would otherwise write the old entry back over the new one)."""
    book = Book(PlacementFile(tmp_path))
    book.change(lambda entries: entries.update(gemma=GEMMA))
    fleetwide = Fleetwide(backend=None, settings=Settings(state_dir=tmp_path), fleet=None, head="h", book=book)
    moved = dataclasses.replace(GEMMA, replicas=(Replica("c", "http://10.0.0.4:8110", "fp2"),))
    results: list = []
    with fleetwide.owning("gemma"):  # an up of gemma under way
        recovery = threading.Thread(target=lambda: results.append(fleetwide.recover(GEMMA, wait=1, within=1)))
        recovery.start()
        recovery.join(0.2)
        assert recovery.is_alive()  # waiting for the up
        book.change(lambda entries: entries.update(gemma=moved))  # the up records where gemma runs now
    recovery.join(5)
    assert results == [None] and book.get("gemma") == moved
