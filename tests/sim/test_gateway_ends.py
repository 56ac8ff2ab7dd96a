"""Every request the gateway accepts ends in an answer or a close, whatever its handler raises.

An audit locked a gateway up for good with 4,096 small requests and no key: a JSON integer of
over 4,300 digits, JSON nested too deep and an Origin that is not a URL each made a handler
raise, and the request was left with neither an answer nor a close (its socket in CLOSE-WAIT,
one slot of the connection cap gone). Here the rule is checked as a property: hypothesis throws
bodies, headers and JSON at every route (the OpenAI routes in front of a sim engine, the pages,
the dashboard and its API passed through to the daemon's real API app); after each request no
socket of the gateway is in CLOSE-WAIT, no connection is left open, and /health answers 200.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sparkctl.gateway.limits import Limits
from sparkctl.gateway.login import Logins
from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.routes import RouteTable, Upstream
from sparkctl.gateway.ui import Dashboard
from tests.conftest import Running, ServedApi, wait_for
from tests.unit.test_dashboard_gate import Service

ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/nowhere", "/ui",
          "/ui/app.js", "/ui/login", "/ui/api/v1/status", "/ui/api/v1/events", "/ui/api/v1/desired", "/ui/api/v1/down",
          "/ui/api/v1/up", "/ui/api/v1/switch", "/ui/api/v1/park", "/ui/api/v1/report", "/ui/api/v1/report-file"]
DEEP = b"[" * 20_000 + b"]" * 20_000
HUGE = b'{"model": "tiny", "max_tokens": ' + b"9" * 4_301 + b"}"
CLOSE_WAIT = "08"  # the state's code in /proc/net/tcp
JSON = {"Content-Type": "application/json"}  # what the OpenAI routes take


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, tiny_model) -> Iterator[Running]:
    from tests.sim.conftest import SimProcess

    engine = SimProcess(tiny_model, scale=0.0)
    engine.wait_ready()
    table = RouteTable(upstreams={"tiny": Upstream("tiny", engine.url, "tiny")}, aliases={"primary": "tiny"})
    with ServedApi(Service(), tmp_path_factory.mktemp("api") / "api.sock") as sock:
        gw = Gateway(lambda: table, limits=Limits(connections=16))
        gw.ui = Dashboard(f"unix:{sock}", gw.upstreams, Logins(b"k" * 64))
        running = Running(gw)
        try:
            yield running
        finally:
            running.stop()
            engine.stop()


def json_values() -> st.SearchStrategy:
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.sampled_from(["model", "messages", "prompt", "stream", "max_tokens",
                                                           "alias", "stack", "runs", "how"]) | st.text(max_size=8),
                                          inner, max_size=4), max_leaves=12)


def bodies() -> st.SearchStrategy[bytes]:
    shaped = st.fixed_dictionaries({"model": st.sampled_from(["tiny", "primary", "nope"]) | st.integers()},
                                   optional={"prompt": st.text(max_size=20), "max_tokens": st.integers(-2, 3),
                                             "stream": st.booleans(), "messages": json_values()})
    return (st.binary(max_size=64) | json_values().map(lambda v: json.dumps(v).encode())
            | shaped.map(lambda v: json.dumps(v).encode()) | st.sampled_from([DEEP, HUGE, b"[1e999]", b"\xff"]))


def headers() -> st.SearchStrategy[dict[str, str]]:
    names = st.sampled_from(["Origin", "Cookie", "X-Sparkctl-Token", "Content-Type", "Accept", "Authorization",
                             "Expect", "X-Anything"])
    values = st.sampled_from(["http://[::1", "http://127.0.0.1", "null", "sparkctl_ui=x", "text/event-stream",
                              "application/json", "Bearer x", "Basic !!", "100-continue", "://", "http://[", ""]) \
        | st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=30)
    return st.dictionaries(names, values, max_size=4)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                                                                                  HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]), path=st.sampled_from(ROUTES), body=bodies(),
       extra=headers())
@example(method="POST", path="/v1/chat/completions", body=HUGE, extra=JSON)
@example(method="POST", path="/v1/completions", body=DEEP, extra=JSON)
@example(method="POST", path="/ui/api/v1/down", body=b"{}", extra={"Origin": "http://[::1"})
def test_every_request_ends_in_an_answer_or_a_close(gateway, method, path, body, extra) -> None:
    status = exchange(gateway, method, path, body, extra)
    assert status is None or 100 <= status < 600
    settled(gateway)


def test_requests_whose_handler_raises_never_use_up_the_connection_cap(gateway) -> None:
    """The audit's lock-up, at a cap of 16: each kind of failing request, four times the cap."""
    for i in range(64):
        body, extra = [(HUGE, JSON), (DEEP, JSON), (b"{}", {"Origin": "http://[::1"})][i % 3]
        path = "/ui/api/v1/down" if "Origin" in extra else "/v1/chat/completions"
        assert exchange(gateway, "POST", path, body, extra) in (400, 403)
    settled(gateway)


def test_a_handler_that_raises_is_answered_500_in_the_envelope(gateway, monkeypatch) -> None:
    """Whatever the bug, the request ends: a 500 from sparkctl, one log line, the connection closed."""
    gw = gateway.gateway
    monkeypatch.setitem(gw.pages, "/health", lambda conn: 1 / 0)
    host = gateway.url.removeprefix("http://")
    conn = http.client.HTTPConnection(host, timeout=10)
    conn.request("GET", "/health")
    reply = conn.getresponse()
    answer = json.loads(reply.read())
    assert reply.status == 500 and answer["error"]["source"] == "sparkctl"
    assert "ZeroDivisionError" in answer["error"]["message"] and reply.getheader("Connection") == "close"
    monkeypatch.undo()
    settled(gateway)


def exchange(running: Running, method: str, path: str, body: bytes, extra: dict[str, str]) -> int | None:
    """One request on its own connection; its status (None if the gateway closed without one)."""
    host = running.url.removeprefix("http://")
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}",
            *(f"{k}: {v}" for k, v in extra.items())]
    with socket.create_connection(("127.0.0.1", running.port), timeout=10) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        got = b""
        while b"\r\n" not in got:
            piece = sock.recv(65536)  # a timeout here is the failure: neither an answer nor a close
            if not piece:
                return None
            got += piece
    found = re.match(rb"HTTP/1\.1 (\d{3}) ", got)
    return int(found.group(1)) if found else None


def settled(running: Running) -> None:
    """No connection of the gateway left open, none in CLOSE-WAIT, and /health 200."""
    wait_for(lambda: running.gateway.limits.open == 0 and not close_waits(running.port), timeout=10,
             what=f"connections closed (open {running.gateway.limits.open}, CLOSE-WAIT {close_waits(running.port)})")
    conn = http.client.HTTPConnection(running.url.removeprefix("http://"), timeout=10)
    conn.request("GET", "/health")
    assert conn.getresponse().status == 200
    conn.close()
    wait_for(lambda: running.gateway.limits.open == 0, timeout=10, what="the health check's connection closed")


def close_waits(port: int) -> int:
    """Sockets on 127.0.0.1:`port` in CLOSE-WAIT (the server's side of a client that left)."""
    local = f"0100007F:{port:04X}"
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for line in lines if line.split()[1] == local and line.split()[3] == CLOSE_WAIT)


def test_close_waits_reads_the_kernels_table() -> None:
    """The check above can see a CLOSE-WAIT socket: a server that never closes one it accepted."""
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    client.close()
    wait_for(lambda: close_waits(server.getsockname()[1]) == 1, timeout=5, what="a CLOSE-WAIT socket")
    accepted.close()
    server.close()
