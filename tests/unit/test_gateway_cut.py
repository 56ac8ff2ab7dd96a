"""Answers under way that can no longer finish: a stream whose engine falls silent for the
gateway's `stall` bound, and the streams on a host or engine the gateway ejects, end at once for
the client, who sees an incomplete response it can retry (an SSE stream gets an error event in
sparkctl's envelope first), and the silent engine leaves routing. A whole (non-streamed) answer
is not bound by the stall: it comes at once when done, and only its first-byte bound (far off
here) applies. Against scripted engines on real loopback sockets."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Iterator

import pytest

from sparkctl.gateway.exchange import Bounds
from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.routes import RouteTable, Upstream
from tests.conftest import Running
from tests.unit.test_replicas import Clock, Engines, ask, on_loop, port, replicated

STALL = 0.5
CLIENT_TIMEOUT = 20.0  # far past STALL: a stream the gateway fails to end shows as this timeout


@pytest.fixture
def world() -> Iterator[tuple[Running, Engines, dict[str, RouteTable]]]:
    tables: dict[str, RouteTable] = {"now": RouteTable()}
    running = Running(Gateway(lambda: tables["now"], hold_timeout=5.0, bounds=Bounds(stall=STALL)))
    engines = Engines(running)
    yield running, engines, tables
    engines.stop()
    running.stop()


class Stream:
    """A streamed chat request read in a thread: `first` is set once a piece of the answer came;
    `ended` once it ended, with `body` and `error` (the client's view of how it ended)."""

    def __init__(self, running: Running) -> None:
        self.first, self.ended = threading.Event(), threading.Event()
        self.status, self.body, self.error = 0, b"", None
        self.conn = http.client.HTTPConnection("127.0.0.1", running.port, timeout=CLIENT_TIMEOUT)
        self.conn.request("POST", "/v1/chat/completions", json.dumps({"model": "gemma", "stream": True,
                                                                      "messages": [{"role": "user", "content": "x"}]}),
                          {"Content-Type": "application/json"})
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            response = self.conn.getresponse()
            self.status = response.status
            while piece := response.read1(65536):
                self.body += piece
                self.first.set()
        except (http.client.HTTPException, OSError) as e:
            self.error = e
            self.body += getattr(e, "partial", b"")
        finally:
            self.first.set()
            self.ended.set()
            self.conn.close()

    def result(self) -> tuple[bytes, Exception | None]:
        assert self.ended.wait(CLIENT_TIMEOUT + 10)
        return self.body, self.error

    def events(self) -> list[dict]:
        return [json.loads(line[len(b"data: "):]) for line in self.body.split(b"\n") if line.startswith(b"data: ")]


def sparkctl_error(stream: Stream) -> dict:
    """The stream's last event: sparkctl's error; the response ended without its end."""
    body, error = stream.result()
    assert isinstance(error, http.client.IncompleteRead), (error, body)  # not a clean end, not the client's timeout
    last = stream.events()[-1]["error"]
    assert last["source"] == "sparkctl" and last["code"] == "upstream_unavailable", last
    return last


def test_a_stream_whose_engine_falls_silent_ends_with_an_error_and_the_engine_is_ejected(world) -> None:
    running, engines, tables = world
    clock = Clock()  # the ejection lasts until the test is done looking at it
    on_loop(running, lambda: setattr(running.gateway.replicas, "clock", clock))
    silent, good = engines.start("silent"), engines.start("answer")
    tables["now"] = RouteTable({"gemma": replicated(silent, good)})
    stream = Stream(running)
    error = sparkctl_error(stream)
    assert stream.status == 200 and stream.events()[0] == {"n": 1}  # what came before the silence came through
    assert f"sent nothing for {STALL:g} s" in error["message"] and "retry" in error["message"]
    assert list(on_loop(running, lambda: running.gateway.replicas.ejected()["engines"])) == [silent]
    assert ask(running)[2] == {"engine": port(good)}
    assert on_loop(running, lambda: running.gateway.ledger.snapshot().in_flight.get("gemma", 0)) == 0


def test_a_stream_whose_engine_never_answers_goes_to_another_replica_after_the_stall(world) -> None:
    running, engines, tables = world
    mute, good = engines.start("mute"), engines.start("answer")
    tables["now"] = RouteTable({"gemma": replicated(mute, good)})
    stream = Stream(running)
    body, error = stream.result()
    assert error is None and stream.status == 200 and json.loads(body) == {"engine": port(good)}
    assert engines.hits[port(mute)] == 1


def test_a_whole_answer_is_not_bound_by_the_stall(world) -> None:
    """A non-streamed completion sends nothing until it is done, which may take minutes."""
    running, _, tables = world

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0]))
        await asyncio.sleep(3 * STALL)  # the engine generating the whole answer
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"done\": 1}")
        await writer.drain()
        await reader.read()

    async def serve() -> asyncio.Server:
        return await asyncio.start_server(slow, "127.0.0.1", 0)

    server = asyncio.run_coroutine_threadsafe(serve(), running.loop).result(10)
    try:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        tables["now"] = RouteTable({"gemma": replicated(url, "http://127.0.0.1:9")})
        assert ask(running)[::2] == (200, {"done": 1})
        assert on_loop(running, lambda: running.gateway.replicas.ejected()["engines"]) == {}
    finally:
        running.loop.call_soon_threadsafe(server.close)


@pytest.mark.parametrize("eject", ["host", "engine"])
def test_ejecting_a_host_or_engine_ends_its_streams_under_way_at_once(world, eject: str) -> None:
    """Its host is dead (or its group is to be recreated): nothing more of the stream will come.
    The stall bound is far off here, so only the ejection can end the stream in time."""
    running, engines, tables = world
    on_loop(running, lambda: setattr(running.gateway, "bounds", Bounds(stall=600.0)))
    url = engines.start("silent")
    tables["now"] = RouteTable({"gemma": Upstream("gemma", url, "tiny", placed=True)})
    stream = Stream(running)
    assert stream.first.wait(CLIENT_TIMEOUT) and not stream.ended.is_set()
    if eject == "host":
        on_loop(running, lambda: running.gateway.eject_host("127.0.0.1"))
    else:
        on_loop(running, lambda: running.gateway.eject_engine(url))
    error = sparkctl_error(stream)
    assert "left routing" in error["message"] if eject == "host" else "failed its probe" in error["message"]
    assert stream.events()[0] == {"n": 1}
    gateway = running.gateway
    assert on_loop(running, lambda: (gateway.on_engine.get(url), gateway.ledger.snapshot().in_flight.get("gemma", 0),
                                     gateway.replicas.load.get(url))) == (set(), 0, 0)
