"""Replicas of a stack behind the gateway: least in-flight picking, a cap per replica, ejection of
an engine that refuses or resets before answering or answers 503 asleep (with a retry on another
replica, and the engine back once it serves again), ejection of a whole host, and the hold while
a stack has no replica in routing. The picking is pure; the
gateway cases run against scripted engines on real loopback sockets."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Iterator

import pytest

from sparkctl.gateway.http1 import chunk
from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.replicas import Replicas, host_of
from sparkctl.gateway.routes import RouteTable, Upstream
from tests.conftest import Running, wait_for

A, B, C = "http://10.213.7.2:8110", "http://10.213.7.3:8110", "http://10.213.7.4:8110"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def replicated(*urls: str, cap: int | None = None, stack: str = "gemma") -> Upstream:
    return Upstream(stack, urls[0], "tiny", cap, replicas=urls[1:])


@pytest.mark.parametrize(("load", "picked"), [
    ({}, A),  # all idle: the first in turn
    ({A: 1}, B),
    ({A: 2, B: 1, C: 1}, B),  # a tie between B and C: the first of them in turn
    ({A: 0, B: 0, C: 0}, A),
    ({A: 3, B: 3, C: 2}, C),
])
def test_the_replica_with_the_fewest_requests_in_flight_is_picked(load: dict[str, int], picked: str) -> None:
    replicas = Replicas()
    replicas.load.update(load)
    assert replicas.take(replicated(A, B, C)) == picked
    assert replicas.load[picked] == load.get(picked, 0) + 1


def test_ties_are_taken_in_turn_so_sequential_requests_spread() -> None:
    replicas, upstream = Replicas(), replicated(A, B, C)
    picked = []
    for _ in range(6):
        url = replicas.take(upstream)
        picked.append(url)
        replicas.give(url, "gemma")
    assert picked == [A, B, C, A, B, C]


def test_a_single_engine_stack_is_its_url() -> None:
    upstream = Upstream("gemma", A, "tiny")
    assert upstream.urls == (A,) and Replicas().take(upstream) == A
    assert host_of(B) == "10.213.7.3"


def test_the_cap_is_per_replica_and_waiters_get_slots_in_order() -> None:
    async def scenario() -> None:
        replicas, upstream = Replicas(), replicated(A, B, cap=1)
        assert [replicas.take(upstream), replicas.take(upstream), replicas.take(upstream)] == [A, B, None]
        first = asyncio.ensure_future(replicas.wait(upstream))
        second = asyncio.ensure_future(replicas.wait(upstream))
        await asyncio.sleep(0)
        assert replicas.take(upstream) is None  # a newcomer queues behind the waiters
        replicas.give(B, "gemma")
        assert await first == B and not second.done()
        assert replicas.load == {A: 1, B: 1}  # no engine above its cap of 1
        replicas.give(A, "gemma")
        assert await second == A

    asyncio.run(scenario())


def test_an_ejected_engine_is_left_out_until_its_time_is_up_or_it_is_restored() -> None:
    async def scenario() -> None:
        clock, returned = Clock(), []
        replicas = Replicas(clock=clock, eject_s=5.0, on_return=lambda: returned.append(True))
        upstream = replicated(A, B)
        replicas.eject(A)
        assert replicas.live(upstream) == [B] and {replicas.take(upstream) for _ in range(3)} == {B}
        clock.now += 5.0
        assert replicas.live(upstream) == [A, B]
        replicas.eject(B)
        replicas.restore(B)
        assert replicas.live(upstream) == [A, B] and returned == [True]
        assert replicas.ejected() == {"hosts": [], "engines": {}}

    asyncio.run(scenario())


def test_a_held_out_engine_stays_out_when_a_reset_request_ejects_it_again() -> None:
    """A group being recreated is held out until restored; the requests its old rank 0 reset on
    the way eject it for 5 s, which must not bring it back before the new group serves."""
    async def scenario() -> None:
        clock = Clock()
        replicas, upstream = Replicas(clock=clock, eject_s=5.0), replicated(A)
        replicas.hold_out(A)
        replicas.eject(A)
        clock.now += 60.0
        assert replicas.live(upstream) == []
        replicas.restore(A)
        assert replicas.live(upstream) == [A]

    asyncio.run(scenario())


def test_ejecting_a_host_takes_every_replica_on_it_out_and_wakes_the_waiters() -> None:
    async def scenario() -> None:
        returned = []
        replicas = Replicas(on_return=lambda: returned.append(True))
        two, lone = replicated(A, B, cap=1), Upstream("lone", "http://10.213.7.3:8111", "other")
        assert replicas.take(two) == A and replicas.take(two) == B
        waiter = asyncio.ensure_future(replicas.wait(two))
        await asyncio.sleep(0)
        replicas.eject_host("10.213.7.3")
        assert await waiter is None  # route again: the stack's replicas changed
        assert replicas.live(two) == [A] and replicas.live(lone) == []
        assert replicas.ejected()["hosts"] == ["10.213.7.3"]
        replicas.restore_host("10.213.7.3")
        assert replicas.live(lone) == ["http://10.213.7.3:8111"] and returned == [True]

    asyncio.run(scenario())


def test_a_waiter_that_leaves_passes_its_slot_on() -> None:
    async def scenario() -> None:
        replicas, upstream = Replicas(), replicated(A, cap=1)
        assert replicas.take(upstream) == A
        leaving = asyncio.ensure_future(replicas.wait(upstream))
        staying = asyncio.ensure_future(replicas.wait(upstream))
        await asyncio.sleep(0)
        replicas.give(A, "gemma")  # handed to `leaving`...
        leaving.cancel()  # ...which goes away before it runs
        assert await staying == A

    asyncio.run(scenario())


# --- the gateway, against scripted engines on loopback ----------------------------------------------
ASLEEP = {"error": {"message": "The engine is sleeping; POST /wake_up to serve requests again.",
                    "type": "ServiceUnavailableError", "param": None, "code": 503}}  # the sim's, while asleep


class Engines:
    """Loopback engines on the gateway's loop: `answer` ones reply with their name (or, while
    `asleep`, 503 as a sleeping engine does), `reset` ones close every connection before answering
    (as a killed engine's socket does), `silent` ones start an SSE stream, send one event and then
    nothing more, `mute` ones read the request and never answer."""

    def __init__(self, running: Running) -> None:
        self.running, self.servers, self.hits = running, [], {}
        self.asleep: set[int] = set()  # ports of `answer` engines put to sleep
        self.kinds = {"answer": self._answer, "reset": self._reset, "silent": self._silent, "mute": self._mute}

    def start(self, kind: str) -> str:
        async def serve() -> str:
            server = await asyncio.start_server(self.kinds[kind], "127.0.0.1", 0)
            self.servers.append(server)
            return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

        return asyncio.run_coroutine_threadsafe(serve(), self.running.loop).result(10)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = writer.get_extra_info("sockname")[1]
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0]))
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            self.hits[port] = self.hits.get(port, 0) + 1
            status, body = ("503 Service Unavailable", ASLEEP) if port in self.asleep else ("200 OK", {"engine": port})
            raw = json.dumps(body).encode()
            writer.write(b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (status.encode(), len(raw), raw))

    async def _reset(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = writer.get_extra_info("sockname")[1]
        self.hits[port] = self.hits.get(port, 0) + 1
        writer.transport.abort()

    async def _silent(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._mute(reader, writer, then=b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                             b"Transfer-Encoding: chunked\r\n\r\n" + chunk(b'data: {"n": 1}\n\n'))

    async def _mute(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, then: bytes = b"") -> None:
        """Read the request, write `then`, and wait (sending nothing) until the gateway closes."""
        port = writer.get_extra_info("sockname")[1]
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0]))
            self.hits[port] = self.hits.get(port, 0) + 1
            writer.write(then)
            await reader.read()  # until the gateway closes its end
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    def stop(self) -> None:
        for server in self.servers:
            self.running.loop.call_soon_threadsafe(server.close)


@pytest.fixture
def world() -> Iterator[tuple[Running, Engines, dict]]:
    tables: dict[str, RouteTable] = {"now": RouteTable()}
    running = Running(Gateway(lambda: tables["now"], hold_timeout=5.0))
    engines = Engines(running)
    yield running, engines, tables
    engines.stop()
    running.stop()


def ask(running: Running, model: str = "gemma") -> tuple[int, dict, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps({"model": model, "prompt": "x"}),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    status, headers, body = response.status, dict(response.getheaders()), json.loads(response.read())
    conn.close()
    return status, headers, body


def port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_an_engine_that_resets_before_answering_is_ejected_and_the_request_goes_to_another(world) -> None:
    running, engines, tables = world
    broken, good = engines.start("reset"), engines.start("answer")
    tables["now"] = RouteTable({"gemma": replicated(broken, good)})
    answers = [ask(running) for _ in range(4)]
    assert [(s, b["engine"]) for s, _, b in answers] == [(200, port(good))] * 4
    assert engines.hits[port(broken)] == 1  # tried once, then out of routing
    assert list(on_loop(running, lambda: running.gateway.replicas.ejected()["engines"])) == [broken]


def test_an_engine_asleep_is_ejected_its_requests_go_to_another_and_it_is_back_once_awake(world) -> None:
    """An engine put to sleep without the daemon's word answers 503: it leaves routing as if it had
    refused, no client sees the 503, and once its ejection is over it gets requests again."""
    running, engines, tables = world
    clock = Clock()  # the ejection ends when the test says so
    on_loop(running, lambda: setattr(running.gateway.replicas, "clock", clock))
    sleeper, good = engines.start("answer"), engines.start("answer")
    engines.asleep.add(port(sleeper))
    tables["now"] = RouteTable({"gemma": replicated(sleeper, good)})
    assert [(s, b["engine"]) for s, _, b in (ask(running) for _ in range(4))] == [(200, port(good))] * 4
    assert engines.hits[port(sleeper)] == 1  # tried once, then out of routing
    assert list(on_loop(running, lambda: running.gateway.replicas.ejected()["engines"])) == [sleeper]
    engines.asleep.clear()
    clock.now += running.gateway.replicas.eject_s
    assert {b["engine"] for s, _, b in (ask(running) for _ in range(4))} == {port(sleeper), port(good)}


def test_a_placed_stack_whose_only_engine_is_asleep_holds_its_requests_until_it_serves_again(world) -> None:
    running, engines, tables = world
    on_loop(running, lambda: setattr(running.gateway.replicas, "eject_s", 1.0))  # PLACED_RETRIES of them: 7 s
    url = engines.start("answer")
    engines.asleep.add(port(url))
    tables["now"] = RouteTable({"gemma": Upstream("gemma", url, "tiny", placed=True)})
    answers: list[tuple[int, dict, dict]] = []
    client = threading.Thread(target=lambda: answers.append(ask(running)))
    client.start()
    wait_for(lambda: on_loop(running, lambda: len(h.waiting) if (h := running.gateway.outages.get("gemma")) else 0)
             == 1, timeout=20)
    assert not answers  # held, not answered 503
    engines.asleep.clear()  # woken by whoever put it to sleep
    client.join(20)
    assert [(status, body["engine"]) for status, _, body in answers] == [(200, port(url))]


def test_a_lone_engine_on_this_spark_that_is_asleep_answers_its_own_503(world) -> None:
    """Nothing else could serve it and nothing re-places it: the engine's answer goes through."""
    running, engines, tables = world
    url = engines.start("answer")
    engines.asleep.add(port(url))
    tables["now"] = RouteTable({"gemma": Upstream("gemma", url, "tiny")})
    assert ask(running)[::2] == (503, ASLEEP)
    assert on_loop(running, lambda: running.gateway.replicas.ejected()) == {"hosts": [], "engines": {}}


def test_a_lone_engine_that_resets_is_a_502_as_before(world) -> None:
    running, engines, tables = world
    tables["now"] = RouteTable({"gemma": Upstream("gemma", engines.start("reset"), "tiny")})
    status, _, body = ask(running)
    assert status == 502 and body["error"]["code"] == "upstream_unavailable"
    assert on_loop(running, lambda: running.gateway.replicas.ejected()) == {"hosts": [], "engines": {}}


def test_a_stack_whose_only_host_is_ejected_holds_its_requests_until_the_host_is_restored(world) -> None:
    running, engines, tables = world
    url = engines.start("answer")
    tables["now"] = RouteTable({"gemma": Upstream("gemma", url, "tiny")})
    on_loop(running, lambda: running.gateway.eject_host("127.0.0.1"))
    held: list[tuple[int, dict, dict]] = []
    client = threading.Thread(target=lambda: held.append(ask(running)))
    client.start()
    wait_for(lambda: on_loop(running, lambda: len(running.gateway.outages.get("gemma").waiting)
                             if "gemma" in running.gateway.outages else 0) == 1)
    assert not held and engines.hits == {}
    on_loop(running, lambda: running.gateway.restore_host("127.0.0.1"))
    client.join(10)
    assert held[0][0] == 200 and held[0][2]["engine"] == port(url)


def test_a_hold_with_no_replica_back_in_time_is_a_503_with_retry_after(world) -> None:
    running, engines, tables = world
    tables["now"] = RouteTable({"gemma": Upstream("gemma", engines.start("answer"), "tiny")})
    running.gateway.hold_timeout = 0.2
    on_loop(running, lambda: running.gateway.eject_host("127.0.0.1"))
    status, headers, body = ask(running)
    assert status == 503 and headers["Retry-After"] and body["error"]["code"] == "no_replica"
    assert "a replica of stack gemma to come back" in body["error"]["message"] and not engines.hits


def on_loop(running: Running, fn):
    async def call():
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), running.loop).result(10)
