"""Nothing proxied lasts for good: a client that stops reading, an engine that never answers a
whole (non-streamed) request, and a request still going at its deadline are each ended within
their bound, and the capped stack's only slot is free again for the next client.

An audit held a capped stack's only slot for as long as it liked with a client that stopped
reading (the stall bound counts the engine's silence only, not the time the client keeps its
socket full), and a non-streamed request to a hung engine had no answer after 45 s. Through a
real gateway in front of the simulated engine (`hang_requests` is its wedged-core fault), with
bounds of a fraction of a second."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import openai
import pytest
from structlog.testing import capture_logs

from sparkctl.gateway.exchange import Bounds
from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.routes import RouteTable, Upstream
from tests.conftest import Running, wait_for

BOUND = 0.5  # s: each test's bound
CLIENT_TIMEOUT = 15.0  # far past BOUND, far short of the ~56 s stream: a bound not enforced shows as this
LONG = {"model": "serial", "prompt": "x", "max_tokens": 50000, "ignore_eos": True}  # ~56 s of tokens


@pytest.fixture
def gateway(sim) -> Iterator[Callable[..., Running]]:
    """Start a gateway with `bounds` in front of a sim engine (`scale`, `faults`), as the stack
    `qwen` capped at one request at a time."""
    started: list[Running] = []

    def start(bounds: Bounds, *, scale: float = 0.01, faults: str = "") -> Running:
        engine = sim("--sim-profile", "qwen36-nvfp4", scale=scale, env={"SPARKCTL_SIM_FAULTS": faults})
        engine.wait_ready()
        table = RouteTable(upstreams={"qwen": Upstream("qwen", engine.url, "tiny", max_concurrency=1)},
                           aliases={"serial": "qwen"})
        started.append(Running(Gateway(lambda: table, bounds=bounds)))
        return started[-1]

    yield start
    for running in started:
        running.stop()


def client(running: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0, timeout=CLIENT_TIMEOUT)


def short(running: Running) -> str:
    """A short completion from the capped stack: it needs the stack's only slot."""
    with client(running) as c:
        return c.completions.create(model="serial", prompt="x", max_tokens=4).choices[0].text


def on_loop(running: Running, fn):
    done, box = threading.Event(), []
    running.loop.call_soon_threadsafe(lambda: (box.append(fn()), done.set()))
    assert done.wait(10)
    return box[0]


def settled(running: Running) -> None:
    """Nothing of the gateway's is left: no request in flight, no client connection open."""
    gateway = running.gateway
    state = lambda: (gateway.ledger.snapshot().in_flight.get("qwen", 0), gateway.limits.open)  # noqa: E731
    wait_for(lambda: on_loop(running, state) == (0, 0), 10, "the gateway to settle (in flight, connections)",
             lambda: str(on_loop(running, state)))


def test_a_client_that_stops_reading_frees_the_capped_stacks_only_slot(gateway) -> None:
    """The stream must outgrow the gateway's socket buffer (the kernel autotunes it up to
    tcp_wmem's 4 MiB on loopback): 50,000 tokens of ~200 bytes, at ~7 MB/s (scale 0.0001)."""
    gateway = gateway(Bounds(client_pause=BOUND), scale=0.0001)
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # its socket fills after a few KiB
    reader.connect(("127.0.0.1", gateway.port))
    body = json.dumps({**LONG, "stream": True}).encode()
    reader.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    assert reader.recv(12) == b"HTTP/1.1 200"  # its stream started; it reads no further
    with capture_logs() as logs:
        started = time.monotonic()
        assert short(gateway)  # the next client is served once the silent reader's bound is up
        waited = time.monotonic() - started
    assert waited < CLIENT_TIMEOUT / 2, waited
    [ended] = [e for e in logs if e["event"] == "gateway_request_ended"]
    assert ended["bound"] == "client_pause" and ended["stack"] == "qwen" and ended["started"]
    settled(gateway)  # its connection too, though it still reads nothing: what was queued to it is dropped
    reader.close()


def test_a_whole_answer_from_a_hung_engine_is_a_504_within_its_bound(gateway) -> None:
    running = gateway(Bounds(first_byte=BOUND), faults="hang_requests")
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as e, client(running) as c:
        c.completions.create(model="serial", prompt="x", max_tokens=4)
    assert time.monotonic() - started < BOUND + 3
    assert e.value.status_code == 504 and e.value.body["source"] == "sparkctl"
    assert e.value.body["code"] == "upstream_timeout" and f"sent nothing for {BOUND:g} s" in e.value.body["message"]
    # a stream is bound by the stall, not by the first byte: it gets its own 504 only at its stall
    on_loop(running, lambda: setattr(running.gateway, "bounds", Bounds(first_byte=BOUND, stall=3 * BOUND)))
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as e, client(running) as c:
        c.completions.create(model="serial", prompt="x", max_tokens=4, stream=True)
    assert 3 * BOUND <= time.monotonic() - started < 3 * BOUND + 3 and e.value.status_code == 504
    settled(running)


class Reading:
    """A request whose answer is read as it comes, in a thread: `status`, `body` and how it ended
    (`error`: None for a clean end)."""

    def __init__(self, running: Running, body: dict) -> None:
        self.started, self.ended = threading.Event(), threading.Event()
        self.status, self.body, self.error = 0, b"", None
        self.conn = http.client.HTTPConnection("127.0.0.1", running.port, timeout=CLIENT_TIMEOUT)
        self.conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            response = self.conn.getresponse()
            self.status = response.status
            self.started.set()
            while piece := response.read1(65536):
                self.body += piece
        except (http.client.HTTPException, OSError) as e:
            self.error = e
            self.body += getattr(e, "partial", b"")
        finally:
            self.started.set()
            self.ended.set()
            self.conn.close()

    def result(self) -> tuple[int, bytes, Exception | None]:
        assert self.ended.wait(CLIENT_TIMEOUT + 5)
        return self.status, self.body, self.error


def test_a_request_past_its_deadline_is_ended_where_it_is(gateway) -> None:
    """A stream under way is broken off with sparkctl's error event; a request waiting behind it at
    the stack's cap, then for its whole answer, gets a 504; the slot serves the next client."""
    gateway = gateway(Bounds(deadline=2 * BOUND))
    stream = Reading(gateway, {**LONG, "stream": True})
    assert stream.started.wait(CLIENT_TIMEOUT) and stream.status == 200
    with capture_logs() as logs:
        whole = Reading(gateway, LONG)  # waits at the cap while the stream holds the slot
        status, body, error = stream.result()
        assert isinstance(error, http.client.IncompleteRead), (error, body[-300:])  # not a clean end
        event = json.loads(body.rstrip().rsplit(b"\n", 1)[-1].removeprefix(b"data: "))["error"]
        assert event["source"] == "sparkctl" and "deadline of 1 s" in event["message"], event
        status, body, error = whole.result()
        assert error is None and status == 504, (status, body, error)
        answer = json.loads(body)["error"]
        assert answer["code"] == "deadline_exceeded" and answer["source"] == "sparkctl"
    assert [(e["bound"], e["started"]) for e in logs if e["event"] == "gateway_request_ended"] == [
        ("deadline", True), ("deadline", False)]
    assert short(gateway)
    settled(gateway)
