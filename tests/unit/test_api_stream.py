"""An action's NDJSON stream ends with its outcome as soon as the action's own last event is
seen, even when the worker thread's result reaches the event loop later (it used to wait out
the 15 s event poll then, one `up` in a dozen)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

import structlog
from aiohttp.test_utils import TestClient, TestServer

from sparkctl import results, wire
from sparkctl.daemon import api
from sparkctl.daemon.events import EventBus
from sparkctl.daemon.turns import Turns


class Actions:
    """The API's `Commands`, with an `up` that publishes one note."""

    def __init__(self) -> None:
        self.bus, self.turns, self.deploys = EventBus(), Turns(), self

    def up(self, stack: str, *, refresh: bool, replace: bool, ticket: int) -> results.UpDone:
        with self.turns.turn(stack, ticket):
            self.bus.publish(wire.Note(stack, "deploying"))
            return results.UpDone(stack, "f" * 12, unchanged=True)


class Reads:
    def check_stack(self, name: str) -> str:
        return name


def build() -> tuple[Actions, object]:
    actions = Actions()
    return actions, api.build(actions, Reads())  # type: ignore[arg-type]


def test_the_stream_ends_when_the_action_does_not_when_its_result_arrives() -> None:
    async def main() -> tuple[list[dict[str, Any]], float]:
        loop = asyncio.get_running_loop()
        plain = loop.run_in_executor

        def late(executor, fn, *args):  # the thread's result reaches the loop 0.3 s after it ended
            future = loop.create_future()
            inner = plain(executor, fn, *args)
            inner.add_done_callback(lambda f: loop.call_later(0.3, future.set_result, f.result()))
            return future

        loop.run_in_executor = late
        async with TestClient(TestServer(build()[1])) as client:
            started = time.monotonic()
            response = await client.post("/v1/up", json={"stack": "a"})
            lines = [json.loads(line) for line in (await response.text()).splitlines()]
            return lines, time.monotonic() - started

    lines, took = asyncio.run(main())
    assert [line["kind"] for line in lines] == ["note", "outcome"]
    assert lines[-1]["ok"] and lines[-1]["result"] == {"done": "up", "stack": "a", "fingerprint": "f" * 12,
                                                   "unchanged": True, "url": "", "acceptance": None}
    assert took < 5, f"the stream waited {took:.1f} s for the next event poll"


def test_a_park_request_with_an_unknown_depth_is_refused_before_it_queues() -> None:
    async def main() -> tuple[int, dict, int]:
        actions, app = build()
        async with TestClient(TestServer(app)) as client:
            response = await client.post("/v1/park", json={"stack": "a", "how": "sleep3"})
            return response.status, await response.json(), actions.turns.ticket("a")

    status, body, next_ticket = asyncio.run(main())
    assert status == 400 and body["error"]["message"] == "`how` must be one of auto, sleep1, sleep2, stop"
    assert next_ticket == 0  # it took no place in the stack's queue


def test_json_that_python_cannot_hold_is_a_400_with_one_line_not_a_500() -> None:
    """An integer over 4,300 digits (a ValueError) or nesting 20,000 deep (a RecursionError), on
    every route that reads a body: a 400 in the API's envelope, and no traceback in the log."""
    bodies = [b'{"stack": ' + b"9" * 4_301 + b"}", b"[" * 20_000 + b"]" * 20_000, b'{"runs": [' + b"1" * 4_400 + b"]}"]

    async def main() -> list[tuple[int, str]]:
        async with TestClient(TestServer(build()[1])) as client:
            answers = []
            for path in ("/v1/up", "/v1/down", "/v1/switch", "/v1/route", "/v1/park", "/v1/wake", "/v1/retest",
                         "/v1/report"):
                for body in bodies:
                    response = await client.post(path, data=body, headers={"Content-Type": "application/json"})
                    answers.append((response.status, (await response.json())["error"]["message"]))
            return answers

    with structlog.testing.capture_logs() as logs, _aiohttp_errors() as errors:
        answers = asyncio.run(main())
    assert {status for status, _ in answers} == {400}
    assert all("\n" not in message for _, message in answers)
    assert errors == [] and not [e for e in logs if e["log_level"] in ("error", "critical")]


@contextlib.contextmanager
def _aiohttp_errors():
    """What aiohttp logs as a handler's unexpected exception (its 500s, with a traceback)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    server_log = logging.getLogger("aiohttp.server")
    server_log.addHandler(handler)
    try:
        yield records
    finally:
        server_log.removeHandler(handler)
