"""The gateway spanning the fleet: a stack's replicas are sim engines on namespace hosts, reached
through the test bridge. Under a bounded load loop of the official openai client, killing one
replica's engine fails no request (an engine that refuses before answering is ejected and the
request goes to another replica), and `eject_host` stops all traffic to a host at once. A stack
whose only host is ejected holds its requests until the host is restored, then serves them. A
stream in flight to a host whose link is cut ends with an error once the host is ejected, while
new requests go to the other replica.

Slow-ish (engines in the hosts' own dockerds, about 10 s in all): what the unit tests of
tests/unit/test_replicas.py cannot show is real engines dying on another host's address."""

from __future__ import annotations

import asyncio
import re
import threading
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.routes import RouteTable, Upstream
from tests.conftest import Running, wait_for
from tests.fleet.conftest import SIM_ENV

REQUESTS, CLIENTS = 90, 4


def served(url: str) -> int:
    """Requests an engine has finished, from its own /metrics."""
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    return int(sum(float(v) for v in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)", text, re.M)))


class Loop:
    """CLIENTS threads sending non-streamed completions back to back until REQUESTS are done;
    `at(n, action)` runs an action once n requests have finished."""

    def __init__(self, url: str) -> None:
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
        self.sent, self.done, self.failures = 0, 0, []
        self.lock = threading.Lock()
        self.actions: dict[int, threading.Event] = {}

    def at(self, count: int) -> threading.Event:
        """An event set once `count` requests have finished (the loop goes on meanwhile)."""
        return self.actions.setdefault(count, threading.Event())

    def run(self) -> threading.Thread:
        threads = [threading.Thread(target=self._client) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        joiner = threading.Thread(target=lambda: [t.join() for t in threads])
        joiner.start()
        return joiner

    def _client(self) -> None:
        while True:
            with self.lock:
                if self.sent >= REQUESTS:
                    return
                self.sent += 1
            try:
                reply = self.client.completions.create(model="primary", prompt="x", max_tokens=8,
                                                       extra_body={"ignore_eos": True})
                assert reply.usage.completion_tokens == 8
                with self.lock:
                    self.done += 1
                    for count, event in self.actions.items():
                        if self.done >= count:
                            event.set()
            except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                with self.lock:
                    self.failures.append(repr(e))


@pytest.fixture
def gateway() -> Iterator[tuple[Running, dict]]:
    tables = {"now": RouteTable()}
    running = Running(Gateway(lambda: tables["now"], hold_timeout=30.0))
    yield running, tables
    running.stop()


def on_loop(running: Running, fn):
    async def call():
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), running.loop).result(10)


def test_replicas_lose_no_request_when_an_engine_dies_or_a_host_is_ejected(fleet, start_on, gateway) -> None:
    running, tables = gateway
    engines = {h: start_on(fleet[h], name="gw-replica", port=8121) for h in "abc"}
    for engine in engines.values():
        engine.wait_ready()
    tables["now"] = RouteTable({"gemma": Upstream("gemma", engines["a"].url, "tiny",
                                                  replicas=(engines["b"].url, engines["c"].url))},
                               aliases={"primary": "gemma"})
    loop = Loop(running.url)
    joiner = loop.run()

    assert loop.at(15).wait(60)
    fleet["a"].docker("kill", engines["a"].id)  # the engine dies mid-loop; its host stays up
    assert loop.at(40).wait(60)
    on_loop(running, lambda: running.gateway.eject_host(fleet["b"].address))
    assert loop.at(55).wait(60)  # what b had in hand when it was ejected is over by now
    on_b = served(engines["b"].url)
    joiner.join(120)

    assert loop.failures == [] and loop.done == REQUESTS
    assert served(engines["b"].url) == on_b  # nothing went to the ejected host
    assert served(engines["c"].url) >= REQUESTS - 55
    assert list(on_loop(running, lambda: running.gateway.replicas.ejected()["engines"])) == [engines["a"].url]


def test_a_single_replica_stack_whose_host_is_ejected_holds_then_serves(fleet, start_on, gateway) -> None:
    running, tables = gateway
    c = fleet["c"]
    engine = start_on(c, name="gw-lone", port=8122)
    engine.wait_ready()
    tables["now"] = RouteTable({"lone": Upstream("lone", engine.url, "tiny")}, aliases={"primary": "lone"})
    on_loop(running, lambda: running.gateway.eject_host(c.address))
    loop = Loop(running.url)
    joiner = loop.run()

    held = lambda: on_loop(running, lambda: len(h.waiting) if (h := running.gateway.outages.get("lone")) else 0)  # noqa: E731
    wait_for(lambda: held() == CLIENTS, what="every client held")
    assert loop.done == 0 and served(engine.url) == 0
    on_loop(running, lambda: running.gateway.restore_host(c.address))
    joiner.join(120)
    assert loop.failures == [] and loop.done == REQUESTS and served(engine.url) == REQUESTS


def test_a_stream_to_a_host_whose_link_is_cut_ends_once_it_is_ejected(fleet, start_on, gateway, monkeypatch) -> None:
    """The cut link sends nothing back, not even a reset: only the eject can end the stream before
    the gateway's stall bound (120 s). The engines run at a Spark's speed, so the stream is long."""
    running, tables = gateway
    monkeypatch.setitem(SIM_ENV, "SPARKCTL_SIM_TIME_SCALE", "1")
    monkeypatch.setitem(SIM_ENV, "SPARKCTL_SIM_LOAD_SCALE", "0.01")
    b, c = fleet["b"], fleet["c"]
    engines = {h.name: start_on(h, name="gw-cut", port=8123) for h in (b, c)}
    for engine in engines.values():
        engine.wait_ready()
    tables["now"] = RouteTable({"placed": Upstream("placed", engines["b"].url, "tiny", replicas=(engines["c"].url,),
                                                   placed=True)}, aliases={"primary": "placed"})
    client = openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    first, ended, outcome = threading.Event(), threading.Event(), []

    def stream() -> None:  # the first request of a fresh gateway goes to the first replica: b's
        try:
            for _ in client.chat.completions.create(model="primary", max_tokens=1800, stream=True,
                                                    messages=[{"role": "user", "content": "x"}],
                                                    extra_body={"ignore_eos": True}):
                first.set()
            outcome.append("ended cleanly")
        except Exception as e:  # noqa: BLE001 - how it ended is the point
            outcome.append(e)
        finally:
            first.set()
            ended.set()

    threading.Thread(target=stream, daemon=True).start()
    try:
        assert first.wait(60) and not ended.is_set(), outcome
        fleet.network.set_link("b", up=False)
        on_loop(running, lambda: running.gateway.eject_host(b.address))
        assert ended.wait(10), "the stream outlived its host's eject"
        assert isinstance(outcome[0], openai.APIError) and f"host {b.address} left routing" in str(outcome[0])
        on_c = served(engines["c"].url)
        for _ in range(3):
            reply = client.chat.completions.create(model="primary", max_tokens=4,
                                                   messages=[{"role": "user", "content": "x"}])
            assert reply.choices[0].message.content
        assert served(engines["c"].url) == on_c + 3
    finally:
        fleet.network.set_link("b", up=True)
