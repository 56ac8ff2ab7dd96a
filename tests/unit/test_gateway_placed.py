"""A stack placed across the fleet behind the gateway: when its lone engine refuses connections
(its host is dying) the request is held, not failed, and goes to the engine the stack is re-placed
on once the routes change, or is a 502 only after a few ejections; a lone engine on this Spark
that refuses is a 502 at once, as before. Against real loopback sockets: a bound port that does
not listen refuses every connection."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from sparkctl.gateway.inflight import PLACED_RETRIES
from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.routes import RouteTable, Upstream
from tests.conftest import Running, wait_for
from tests.unit.test_replicas import Engines, ask, on_loop, port


@pytest.fixture
def world() -> Iterator[tuple[Running, Engines, dict[str, RouteTable]]]:
    tables: dict[str, RouteTable] = {"now": RouteTable()}
    running = Running(Gateway(lambda: tables["now"], hold_timeout=60.0))
    engines = Engines(running)
    yield running, engines, tables
    engines.stop()
    running.stop()


@pytest.fixture
def refusing() -> Iterator[str]:
    """An engine URL whose port is bound but not listening: every connection is refused."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{bound.getsockname()[1]}"


def held(running: Running, stack: str) -> int:
    return on_loop(running, lambda: len(running.gateway.outages[stack].waiting)
                   if stack in running.gateway.outages else 0)


def test_a_placed_stack_whose_lone_engine_refuses_holds_the_request_until_it_is_re_placed(world, refusing) -> None:
    running, engines, tables = world
    tables["now"] = RouteTable({"gemma": Upstream("gemma", refusing, "tiny", placed=True)})
    answers: list[tuple[int, dict, dict]] = []
    client = threading.Thread(target=lambda: answers.append(ask(running)))
    client.start()
    wait_for(lambda: held(running, "gemma") == 1, timeout=20)
    assert not answers  # held, not answered 502
    assert refusing in on_loop(running, lambda: running.gateway.replicas.ejected()["engines"])
    moved = engines.start("answer")
    tables["now"] = RouteTable({"gemma": Upstream("gemma", moved, "tiny", placed=True)})
    on_loop(running, running.gateway.routes_changed)
    client.join(20)
    assert [(status, body["engine"]) for status, _, body in answers] == [(200, port(moved))]
    assert on_loop(running, lambda: running.gateway.outages) == {}


def test_a_placed_stack_whose_engine_keeps_failing_is_a_502_after_a_few_ejections(world) -> None:
    running, engines, tables = world
    on_loop(running, lambda: setattr(running.gateway.replicas, "eject_s", 0.05))  # each ejection, short
    broken = engines.start("reset")
    tables["now"] = RouteTable({"gemma": Upstream("gemma", broken, "tiny", placed=True)})
    status, _, body = ask(running)
    assert status == 502 and body["error"]["code"] == "upstream_unavailable"
    # the first try, the retry every replica gets, then PLACED_RETRIES more (one after each ejection)
    assert engines.hits[port(broken)] == 1 + 1 + PLACED_RETRIES


def test_a_lone_engine_on_this_spark_that_refuses_is_a_502(world, refusing) -> None:
    running, _, tables = world
    tables["now"] = RouteTable({"gemma": Upstream("gemma", refusing, "tiny")})
    status, _, body = ask(running)
    assert status == 502 and body["error"]["code"] == "upstream_unavailable"
    assert on_loop(running, lambda: running.gateway.outages) == {}
