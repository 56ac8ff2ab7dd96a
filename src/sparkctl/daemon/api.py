"""The daemon's local API: HTTP over a unix socket in the state dir (mode 0600), for the CLI.

Routes: GET /v1/status, GET /v1/stacks (`stacks list`'s rows), GET /v1/desired, POST /v1/up,
/v1/down, /v1/switch, /v1/park, /v1/wake, /v1/retest (these stream NDJSON events until the
outcome), GET /v1/events?since=N (long-lived),
GET /v1/logs?stack=S&tail=N (the engine's log, its last N lines then following), GET /v1/history,
GET /v1/runs (benchmark runs), GET /v1/engines (each routed engine's token and TTFT counters),
GET /v1/reports and /v1/report-file?report=ID&path=P (written reports and their files), POST
/v1/report (a comparison report of `{"runs": [...]}`), GET /metrics.
The two long-lived streams are NDJSON, or server-sent events when the request accepts
`text/event-stream` (the dashboard's EventSource, which resumes from `Last-Event-ID`).
Errors are JSON `{"error": {"message", "type"}}`; a bad request never stops the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from sparkctl import answers, wire
from sparkctl.daemon.events import EventBus
from sparkctl.daemon.turns import Turns
from sparkctl.errors import NoSuchFile, NoSuchStack, SparkctlError
from sparkctl.log import redact
from sparkctl.policy.parking import Park
from sparkctl.state.desired import Desired

if TYPE_CHECKING:
    from sparkctl.daemon.actions import Aliases, Deploys, Parking, Trials

MAX_BODY = 64 * 1024
TYPES = {".md": "text/markdown; charset=utf-8", ".png": "image/png", ".json": "application/json",
         ".csv": "text/csv; charset=utf-8"}  # of report files; anything else is sent as bytes
_actions = itertools.count(1)  # numbers the streamed actions, so each finds its own end


class Commands(Protocol):
    """The actions (`daemon/actions/`), each run on a worker thread in the turn of the ticket its
    request took as it arrived."""

    @property
    def bus(self) -> EventBus: ...

    @property
    def turns(self) -> Turns: ...

    @property
    def deploys(self) -> Deploys: ...

    @property
    def parking(self) -> Parking: ...

    @property
    def aliases(self) -> Aliases: ...

    @property
    def trials(self) -> Trials: ...


class Queries(Protocol):
    """What the daemon answers without changing anything (`daemon/reads.py`), on a worker thread."""

    def check_stack(self, name: str) -> str: ...

    def desired(self) -> Desired: ...

    def status(self) -> answers.Status: ...

    def stacks(self) -> tuple[answers.StackRow, ...]: ...

    def history(self, stack: str | None) -> answers.History: ...

    def metrics_text(self) -> str: ...

    def logs(self, stack: str, tail: int) -> Any: ...

    def runs(self) -> tuple[answers.RunRow, ...]: ...

    def engines(self) -> answers.Engines: ...

    def reports(self) -> tuple[answers.ReportRow, ...]: ...

    def report_file(self, report: str, path: str) -> Path: ...


COMMANDS = web.AppKey("commands", Commands)
QUERIES = web.AppKey("queries", Queries)
CLOSING = web.AppKey("closing", asyncio.Event)  # set as the API stops: the long-lived streams end


def build(commands: Commands, queries: Queries, *, token: str | None = None) -> web.Application:
    """The API app; with `token`, every request must carry `Authorization: Bearer <token>`."""
    app = web.Application(client_max_size=MAX_BODY, middlewares=[_errors] + ([_bearer(token)] if token else []))
    app[COMMANDS], app[QUERIES] = commands, queries
    app[CLOSING] = asyncio.Event()
    app.on_shutdown.append(_closing)
    app.router.add_get("/v1/status", status)
    app.router.add_get("/v1/stacks", stacks)
    app.router.add_get("/v1/desired", desired)
    app.router.add_post("/v1/up", up)
    app.router.add_post("/v1/down", down)
    app.router.add_post("/v1/switch", switch)
    app.router.add_post("/v1/route", route)
    app.router.add_post("/v1/park", park)
    app.router.add_post("/v1/wake", wake)
    app.router.add_post("/v1/retest", retest)
    app.router.add_get("/v1/events", events)
    app.router.add_get("/v1/logs", logs)
    app.router.add_get("/v1/runs", runs)
    app.router.add_get("/v1/engines", engines)
    app.router.add_get("/v1/reports", reports)
    app.router.add_get("/v1/report-file", report_file)
    app.router.add_post("/v1/report", compare)
    app.router.add_get("/v1/history", history)
    app.router.add_get("/metrics", metrics)
    return app


async def status(request: web.Request) -> web.Response:
    return web.json_response(asdict(await asyncio.to_thread(request.app[QUERIES].status)))


async def stacks(request: web.Request) -> web.Response:
    rows = await asyncio.to_thread(request.app[QUERIES].stacks)
    return web.json_response({"stacks": [asdict(row) for row in rows]})


async def desired(request: web.Request) -> web.Response:
    d = await asyncio.to_thread(request.app[QUERIES].desired)
    return web.json_response({"stacks": list(d.stacks), "aliases": d.aliases, "fallbacks": d.fallbacks,
                              "parked": d.parked,
                              "routes": {a: [asdict(r) for r in rules] for a, rules in d.routes.items()}})


async def up(request: web.Request) -> web.StreamResponse:
    return await _on_stack(request, wire.UpRequest, lambda actions, ask, stack, ticket: actions.deploys.up(
        stack, refresh=ask.refresh, replace=ask.replace, ticket=ticket))


async def down(request: web.Request) -> web.StreamResponse:
    return await _on_stack(request, wire.DownRequest,
                           lambda actions, ask, stack, ticket: actions.deploys.down(stack, ticket=ticket))


async def switch(request: web.Request) -> web.StreamResponse:
    ask = await _request(request, wire.SwitchRequest)
    actions, reads = request.app[COMMANDS], request.app[QUERIES]
    async with _queued(actions, f"alias:{ask.alias}") as ticket:
        stack = await asyncio.to_thread(reads.check_stack, ask.stack)
        old = (await asyncio.to_thread(reads.desired)).aliases.get(ask.alias)
    return await _stream_action(request, (stack, ask.alias, *filter(None, [old])),
                                lambda: actions.aliases.switch(ask.alias, stack, ticket=ticket))


async def route(request: web.Request) -> web.StreamResponse:
    ask = await _request(request, wire.RouteRequest)
    actions = request.app[COMMANDS]
    async with _queued(actions, f"alias:{ask.alias}") as ticket:
        pass
    return await _stream_action(request, (ask.alias,),
                                lambda: actions.aliases.route(ask.alias, ask.rules, ticket=ticket))


async def park(request: web.Request) -> web.StreamResponse:
    return await _on_stack(request, wire.ParkRequest,
                           lambda actions, ask, stack, ticket: actions.parking.park(stack, how=Park(ask.how),
                                                                                   ticket=ticket),
                           check=lambda ask: ask.how in set(Park) or f"`how` must be one of {', '.join(Park)}")


async def wake(request: web.Request) -> web.StreamResponse:
    return await _on_stack(request, wire.WakeRequest,
                           lambda actions, ask, stack, ticket: actions.parking.wake(stack, ticket=ticket))


async def retest(request: web.Request) -> web.StreamResponse:
    """One retest at a time; its events are those of the trial of the stack it measures with."""
    ask = await _request(request, wire.RetestRequest)
    trials = request.app[COMMANDS].trials
    async with _queued(request.app[COMMANDS], "retest:") as ticket:
        trial, stack = await asyncio.to_thread(trials.retest_target, ask.ref, ask.stack)
    return await _stream_action(request, (trial, stack),
                                lambda: trials.retest(ask.ref, stack=stack, force=ask.force, ticket=ticket))


async def _on_stack(request: web.Request, kind: type[wire.Request], act: Callable[[Commands, Any, str, int], Any],
                    check: Callable[[Any], bool | str] = lambda ask: True) -> web.StreamResponse:
    """An action on one stack: the request checked, a ticket for the stack's turn taken as it
    arrives, the stack name checked, then the action streamed."""
    ask = await _request(request, kind)
    if (problem := check(ask)) is not True:
        raise _bad(400, str(problem))
    actions = request.app[COMMANDS]
    async with _queued(actions, ask.stack) as ticket:
        stack = await asyncio.to_thread(request.app[QUERIES].check_stack, ask.stack)
    return await _stream_action(request, (stack,), lambda: act(actions, ask, stack, ticket))


@contextlib.asynccontextmanager
async def _queued(actions: Commands, key: str) -> AsyncIterator[int]:
    """A ticket for `key`'s next turn, taken as the request arrives (so actions on a stack take
    effect in arrival order). If the request is refused before its action runs, the turn is
    passed on in the background, so the requests behind it are not stuck."""
    ticket = actions.turns.ticket(key)
    try:
        yield ticket
    except BaseException:
        asyncio.get_running_loop().run_in_executor(None, actions.turns.skip, key, ticket)
        raise


async def events(request: web.Request) -> web.StreamResponse:
    bus = request.app[COMMANDS].bus
    try:
        since = int(request.headers.get("Last-Event-ID") or request.query.get("since", bus.last))
    except ValueError:
        raise _bad(400, "`since` must be an event number") from None
    response, write = await _lines(request)
    while (events := await _unless_closing(request, bus.wait_after(since, timeout=15))) is not None:
        for event in events:
            since = event["seq"]
            await write(event, event["seq"])
        if not events:
            await write(None)  # a keep-alive: a browser that left is noticed
    await response.write_eof()
    return response


async def logs(request: web.Request) -> web.StreamResponse:
    """The stack's engine log, its last `tail` lines then each new one, until the client leaves."""
    try:
        tail = min(10_000, max(1, int(request.query.get("tail", "200"))))
    except ValueError:
        raise _bad(400, "`tail` must be a number of lines") from None
    stream = await asyncio.to_thread(request.app[QUERIES].logs, request.query.get("stack", ""), tail)
    loop, lines = asyncio.get_running_loop(), asyncio.Queue()

    def pump() -> None:  # on a worker thread: docker's stream blocks until a line comes
        try:
            for chunk in stream:
                loop.call_soon_threadsafe(lines.put_nowait, chunk)
        finally:
            loop.call_soon_threadsafe(lines.put_nowait, None)

    loop.run_in_executor(None, pump)
    try:
        response, write = await _lines(request)
        while (chunk := await _unless_closing(request, lines.get())) is not None:
            for line in redact(chunk.decode(errors="replace")).splitlines():
                await write({"line": line})
    finally:
        stream.close()  # ends the pump's iteration
    await response.write_eof()
    return response


async def runs(request: web.Request) -> web.Response:
    rows = await asyncio.to_thread(request.app[QUERIES].runs)
    return web.json_response({"runs": [asdict(row) for row in rows]})


async def engines(request: web.Request) -> web.Response:
    return web.json_response(asdict(await asyncio.to_thread(request.app[QUERIES].engines)))


async def reports(request: web.Request) -> web.Response:
    rows = await asyncio.to_thread(request.app[QUERIES].reports)
    return web.json_response({"reports": [asdict(row) for row in rows]})


async def report_file(request: web.Request) -> web.FileResponse:
    path = await asyncio.to_thread(request.app[QUERIES].report_file, request.query.get("report", ""),
                                   request.query.get("path", ""))
    return web.FileResponse(path, headers={"Content-Type": TYPES.get(path.suffix, "application/octet-stream"),
                                           "X-Content-Type-Options": "nosniff"})


async def compare(request: web.Request) -> web.Response:
    """A comparison report of the runs in `{"runs": [id, ...], "label": "..."}`."""
    body = await _json(request)
    try:
        chosen, label = [int(r) for r in body["runs"]], str(body.get("label", ""))
    except (KeyError, TypeError, ValueError, AttributeError):
        raise _bad(400, 'request body must be {"runs": [run id, ...], "label": "..."}') from None
    written = await asyncio.to_thread(request.app[COMMANDS].trials.compare, chosen, label)
    return web.json_response(wire.encode_done(written))


async def history(request: web.Request) -> web.Response:
    found = await asyncio.to_thread(request.app[QUERIES].history, request.query.get("stack"))
    return web.json_response(asdict(found))


async def metrics(request: web.Request) -> web.Response:
    return web.Response(text=await asyncio.to_thread(request.app[QUERIES].metrics_text), content_type="text/plain")


async def _stream_action(request: web.Request, names: tuple[str, ...],
                         work: Callable[[], wire.Done]) -> web.StreamResponse:
    """Run `work` in a thread; stream the events of these stacks (or alias) meanwhile; end with
    the outcome. The work starts before the response does: it holds a ticket that must be used.
    Its last event is its own `Finished`, published after all of its others: the stream ends
    there, whenever the thread's result reaches the loop."""
    stack, action = names[0], next(_actions)
    bus = request.app[COMMANDS].bus
    since = bus.last

    def run() -> wire.Done:
        try:
            return work()
        finally:
            bus.publish(wire.Finished(stack, action))

    task = asyncio.get_running_loop().run_in_executor(None, run)
    response = await _ndjson(request)
    finished = False
    while not finished:
        events = await bus.wait_after(since, timeout=0 if task.done() else 15)
        finished = task.done() and not events  # its Finished fell out of the bus's memory
        for event in events:
            since = event["seq"]
            finished = finished or (event["kind"] == "finished" and event["action"] == action)
            if event.get("stack") in names and event["kind"] in wire.STREAMED:
                await response.write(json.dumps(event).encode() + b"\n")
    await asyncio.wait([task])
    error = task.exception()
    if error is None:
        outcome = wire.Outcome(stack, True, result=task.result())
    else:
        outcome = wire.Outcome(stack, False, error=redact(str(error) if isinstance(error, SparkctlError)
                                                          else f"internal error: {error!r}"))
    line = outcome.to_json() | {"time": time.time()}
    await response.write(json.dumps(line).encode() + b"\n")
    await response.write_eof()
    return response


async def _closing(app: web.Application) -> None:
    app[CLOSING].set()


async def _unless_closing(request: web.Request, step: Any) -> Any:
    """`step`'s result, or None once the API is stopping (a long-lived stream ends then)."""
    waiting, closing = asyncio.ensure_future(step), asyncio.ensure_future(request.app[CLOSING].wait())
    await asyncio.wait({waiting, closing}, return_when=asyncio.FIRST_COMPLETED)
    closing.cancel()
    if waiting.done():
        return waiting.result()
    waiting.cancel()
    return None


async def _lines(request: web.Request) -> tuple[web.StreamResponse, Callable[..., Any]]:
    """Start a long-lived stream; returns it and `write(record, seq=None)`: NDJSON, or server-sent
    events (with `seq` as the event's id) when the client accepts them. `write(None)` keeps it alive."""
    sse = "text/event-stream" in request.headers.get("Accept", "")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream" if sse else "application/x-ndjson",
                                           "Cache-Control": "no-store"})
    await response.prepare(request)

    async def write(record: dict | None, seq: int | None = None) -> None:
        if record is None:
            await response.write(b": keep-alive\n\n" if sse else b"\n")
        elif sse:
            await response.write((f"id: {seq}\n" if seq is not None else "").encode()
                                 + b"data: " + json.dumps(record).encode() + b"\n\n")
        else:
            await response.write(json.dumps(record).encode() + b"\n")

    return response, write


async def _ndjson(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    return response


async def _request(request: web.Request, kind: type[wire.Request]) -> Any:
    return wire.parse(kind, await _json(request))


async def _json(request: web.Request) -> Any:
    """The request's JSON body; a 400 for anything else: not UTF-8, not JSON, an integer over
    Python's 4,300 digits (a ValueError), nesting too deep (a RecursionError)."""
    try:
        return json.loads(await request.read())
    except (ValueError, RecursionError):
        raise _bad(400, "request body is not valid JSON") from None


def _bad(status: int, message: str, kind: str = "bad_request") -> web.HTTPException:
    """The one error envelope: `{"error": {"message", "type"}}` with its status."""
    cls = {400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 404: web.HTTPNotFound}.get(status,
                                                                                        web.HTTPInternalServerError)
    return cls(text=json.dumps({"error": {"message": message, "type": kind}}), content_type="application/json")


def _bearer(token: str) -> Callable:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Callable) -> web.StreamResponse:
        if len(request.headers.getall("Authorization", [])) > 1:  # a proxy in front may have checked another
            raise _bad(400, "more than one Authorization header: send the API token once")
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, expected):
            raise _bad(401, "missing or wrong API token", "unauthorized")
        return await handler(request)

    return check


@web.middleware
async def _errors(request: web.Request, handler: Callable) -> web.StreamResponse:
    """Errors to HTTP, by type, in one place."""
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY, actual_size=0, content_type="application/json",
                                            text=json.dumps({"error": {"message": f"request body over {MAX_BODY} "
                                                                       "bytes", "type": "too_large"}})) from None
    except (NoSuchStack, NoSuchFile) as e:
        raise _bad(404, str(e), "sparkctl_error") from None
    except wire.BadRequest as e:
        raise _bad(400, str(e)) from None
    except SparkctlError as e:
        raise _bad(400, str(e), "sparkctl_error") from None
