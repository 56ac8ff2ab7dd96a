"""An action's NDJSON stream ends with its outcome as soon as the action's own last event is
seen, even when the worker thread's result reaches the event loop later (it used to wait out
the 15 s event poll then, one `up` in a dozen)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from typing import Any

import structlog
from aiohttp.test_utils import TestClient, TestServer

from sparkctl import messages
from sparkctl.daemon import api
from sparkctl.daemon.events import EventBus
from sparkctl.daemon.seam import blocking
from sparkctl.daemon.turns import Turns
from sparkctl.errors import SparkctlError


class Actions:
    """The API's `Commands`, with an `up` that publishes one note."""

    def __init__(self) -> None:
        self.bus, self.turns, self.deploys = EventBus(), Turns(), self

    async def up(self, stack: str, *, refresh: bool, replace: bool, ticket: int, stop: object) -> messages.UpDone:
        async with self.turns.turn(stack, ticket):
            self.bus.publish(messages.Note(stack, "deploying"))
            return messages.UpDone(stack, "f" * 12, unchanged=True)


class Reads:
    def check_stack(self, name: str) -> str:
        return name


def build() -> tuple[Actions, object]:
    actions = Actions()
    return actions, api.build(actions, Reads())  # type: ignore[arg-type]


def test_the_stream_carries_the_actions_events_then_ends_with_its_outcome() -> None:
    async def main() -> tuple[list[dict[str, Any]], float]:
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


class Fetching:
    """The API's `Commands` with an `up` and a `pull` that hold their stack's turn while they
    "fetch": until `release` is set, or their own `stop` (a cancel of that action), which fails them."""

    def __init__(self) -> None:
        self.bus, self.turns, self.deploys = EventBus(), Turns(), self
        self.release, self.ran, self.stops = threading.Event(), [], {}

    async def up(self, stack: str, *, refresh: bool, replace: bool, ticket: int, stop: threading.Event
                 ) -> messages.UpDone:
        await self._fetch("up", stack, ticket, stop)
        return messages.UpDone(stack, "f" * 12, unchanged=False)

    async def pull(self, stack: str, *, refresh: bool, ticket: int, stop: threading.Event) -> messages.PullDone:
        await self._fetch("pull", stack, ticket, stop)
        return messages.PullDone(stack, "f" * 12)

    async def _fetch(self, kind: str, stack: str, ticket: int, stop: threading.Event) -> None:
        async with self.turns.turn(stack, ticket):
            self.ran.append(kind)
            self.stops[kind] = stop
            self.bus.publish(messages.Note(stack, f"{kind} fetching"))
            await blocking(self._streams, kind, stop)

    def _streams(self, kind: str, stop: threading.Event) -> None:
        """On a worker, as the pipeline's fetch: its streams look at `stop` at each progress."""
        while not self.release.wait(0.01):
            if stop.is_set():
                raise SparkctlError(f"{kind}: stopped")


def test_a_cancel_names_its_action_a_queued_one_leaves_the_queue_and_a_running_one_stops_alone() -> None:
    """The audit: client A's `up` of a stack fetches; client B's `pull` of it waits for its turn and
    is cancelled. B leaves the queue (it never runs, its stream says so) and A goes on untouched.
    Then a cancel of A stops A's own fetch, and is answered once A has ended."""
    actions = Fetching()

    async def line(response) -> dict[str, Any]:
        return json.loads(await asyncio.wait_for(response.content.readline(), 10))

    async def main() -> None:
        async with TestClient(TestServer(api.build(actions, Reads()))) as client:  # type: ignore[arg-type]
            up = await client.post("/v1/up", json={"stack": "s", "action": "A"})
            assert (await line(up))["text"] == "up fetching"
            pull = await client.post("/v1/pull", json={"stack": "s", "action": "B"})
            assert (await line(pull))["text"] == "waiting for its turn: an earlier action on s is under way"
            taken = await client.post("/v1/pull", json={"stack": "s", "action": "B"})
            assert taken.status == 400 and "under way already" in (await taken.json())["error"]["message"]
            answer = await (await client.post("/v1/cancel", json={"action": "B"})).json()
            assert answer == {"done": "cancel", "action": "B", "cancelled": True,
                              "why": "it left the queue before its turn: it did not run"}
            outcome = await line(pull)
            assert not outcome["ok"] and outcome["error"] == "cancelled before its turn: it did not run"
            assert actions.ran == ["up"] and not actions.stops["up"].is_set()  # A untouched, still fetching
            answer = await (await client.post("/v1/cancel", json={"action": "B"})).json()
            assert not answer["cancelled"] and answer["why"].startswith("no such action under way")
            answer = await (await client.post("/v1/cancel", json={"action": "A"})).json()  # once A has ended
            assert answer == {"done": "cancel", "action": "A", "cancelled": True, "why": "it stopped: up: stopped"}
            outcome = await line(up)
            assert not outcome["ok"] and outcome["error"] == "up: stopped"
            assert actions.ran == ["up"]  # the cancelled pull never ran, before or after

    asyncio.run(main())


def test_fleet_requests_to_a_daemon_that_heads_no_fleet_say_what_to_do() -> None:
    """`fleet up`, `down` and `ps` are asked of the head's daemon, the one writer of the book: any
    other daemon refuses each with what to do, before it takes a place in the stack's queue."""
    async def main() -> tuple[list[tuple[int, str]], int]:
        actions, app = build()
        actions.fleet = None
        async with TestClient(TestServer(app)) as client:
            said = []
            for path in ("/v1/fleet/up", "/v1/fleet/down", "/v1/fleet/ps"):
                response = await client.post(path, json={"stack": "a"})
                said.append((response.status, (await response.json())["error"]["message"]))
            return said, actions.turns.ticket("a")

    said, next_ticket = asyncio.run(main())
    assert [status for status, _ in said] == [400] * 3
    assert all(text.startswith("this daemon heads no fleet") and "fleet init" in text for _, text in said), said
    assert next_ticket == 0  # no place taken in the stack's queue


def test_a_fleet_request_with_a_bad_wait_is_refused_before_it_queues() -> None:
    async def main() -> tuple[int, str, int]:
        actions, app = build()
        actions.fleet = object()
        async with TestClient(TestServer(app)) as client:
            response = await client.post("/v1/fleet/up", json={"stack": "a", "wait": "soon"})
            return response.status, (await response.json())["error"]["message"], actions.turns.ticket("a")

    assert asyncio.run(main()) == (400, "`wait` must be a number, at least 0, not 'soon'", 0)


def test_a_fleet_up_takes_its_turn_so_the_next_action_on_the_stack_runs() -> None:
    """The ticket a `fleet up` takes as it arrives is used by its action: a `park` after it is not
    left waiting for a turn that never comes."""
    class Fleet:
        def __init__(self, turns: Turns) -> None:
            self.turns = turns

        async def up(self, stack: str, *, wait: float, ticket: int, say) -> messages.FleetUpDone:  # noqa: ANN001
            async with self.turns.turn(stack, ticket):
                return messages.FleetUpDone(stack, ())

    async def main() -> tuple[bool, bool]:
        actions, app = build()
        actions.fleet = Fleet(actions.turns)
        async with TestClient(TestServer(app)) as client:
            first = [json.loads(line) for line in (await (await client.post(
                "/v1/fleet/up", json={"stack": "a"})).text()).splitlines()]
            ticket = actions.turns.ticket("a")
            free = await asyncio.wait_for(_takes_turn(actions.turns, ticket), 5)
            return first[-1]["ok"], free

    assert asyncio.run(main()) == (True, True)


async def _takes_turn(turns: Turns, ticket: int) -> bool:
    async with turns.turn("a", ticket):
        return True
