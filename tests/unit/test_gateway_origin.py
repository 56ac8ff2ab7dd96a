"""Web pages cannot drive the gateway (issue 45, finding 9): a page that a browser on the Spark
visits could POST to the OpenAI routes on loopback as `text/plain` or as a form, which needs no
CORS preflight, and so woke a parked stack. Such a request is refused before its body is read:
it reaches no engine and wakes nothing. Agents (no Origin, a JSON body) and the gateway's own
origin go through. Against a scripted engine on a real loopback socket."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import pytest

from sparkctl.gateway.proxy import Gateway, Waker
from sparkctl.gateway.routes import RouteTable, Upstream
from tests.conftest import Running
from tests.unit.test_replicas import Engines

JSON = {"Content-Type": "application/json"}


@pytest.fixture
def world() -> Iterator[tuple[Running, Engines, list[str], dict[str, RouteTable]]]:
    woken: list[str] = []

    async def wake(stack: str) -> str | None:
        woken.append(stack)
        return "this test wakes nothing"

    tables = {"now": RouteTable()}
    running = Running(Gateway(lambda: tables["now"], waker=Waker(wake, limit=8, timeout=5.0)))
    engines = Engines(running)
    yield running, engines, woken, tables
    engines.stop()
    running.stop()


def post(running: Running, model: str, headers: dict[str, str]) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", running.port, timeout=10)
    conn.request("POST", "/v1/chat/completions", json.dumps({"model": model, "messages": [{"role": "user",
                                                                                          "content": "hi"}]}), headers)
    response = conn.getresponse()
    status, body = response.status, json.loads(response.read())
    conn.close()
    return status, body


@pytest.mark.parametrize(("headers", "status"), [
    ({"Content-Type": "text/plain", "Origin": "http://evil.example"}, 403),  # the audit's request
    ({"Content-Type": "application/x-www-form-urlencoded", "Origin": "null"}, 403),  # a form from a sandboxed page
    ({"Content-Type": "application/json", "Origin": "http://127.0.0.1:1"}, 403),  # another port is another site
    ({"Content-Type": "text/plain;charset=UTF-8"}, 415),  # no Origin, but no JSON either
    ({}, 415),
])
def test_what_a_web_page_can_send_wakes_nothing_and_reaches_no_engine(world, headers: dict, status: int) -> None:
    running, engines, woken, tables = world
    url = engines.start("answer")
    tables["now"] = RouteTable(upstreams={"gemma": Upstream("gemma", url, "tiny")}, parked={"sleepy": "qwen"})
    for model in ("tiny", "sleepy"):
        got, body = post(running, model, headers)
        assert got == status and body["error"]["source"] == "sparkctl", body
    assert engines.hits == {} and woken == []
    # an agent, and the gateway's own page, go through: to the engine, and to the parked stack's wake
    assert post(running, "tiny", JSON)[0] == 200
    assert post(running, "tiny", {**JSON, "Origin": running.url})[0] == 200
    assert sum(engines.hits.values()) == 2
    assert post(running, "sleepy", JSON)[0] == 503 and woken == ["qwen"]
