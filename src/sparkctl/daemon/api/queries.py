"""The API's reads: status, the stack list, the desired state, history, benchmark runs, engines'
counters, the dashboard's time series and charts, reports and their files, the daemon's metrics,
and the two long-lived streams (events, an engine's log)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import asdict

from aiohttp import web

from sparkctl import messages
from sparkctl.daemon.api import http
from sparkctl.daemon.api.service import COMMANDS, FOLLOWS, QUERIES, Queries
from sparkctl.daemon.seam import blocking
from sparkctl.log import redact

TYPES = {".md": "text/markdown; charset=utf-8", ".png": "image/png", ".json": "application/json",
         ".csv": "text/csv; charset=utf-8"}  # of report files; anything else is sent as bytes


KEEPALIVE = 5.0  # seconds without a log line before a keep-alive, which finds a client that left

Handler = Callable[[web.Request], Awaitable[web.Response]]


def _answer(ask: Callable[[Queries], object], key: str | None = None) -> Handler:
    """A handler answering `ask` of the read model (on a worker thread) as JSON: its frozen answer,
    or its list of rows under `key`."""

    async def handler(request: web.Request) -> web.Response:
        found = await blocking(ask, request.app[QUERIES])
        return web.json_response({key: [asdict(row) for row in found]} if key else asdict(found))

    return handler


status = _answer(lambda q: q.status())
stacks = _answer(lambda q: q.stacks(), "stacks")
runs = _answer(lambda q: q.runs(), "runs")
series = _answer(lambda q: q.series())
reports = _answer(lambda q: q.reports(), "reports")


async def desired(request: web.Request) -> web.Response:
    d = await blocking(request.app[QUERIES].desired)
    routes = {a: tuple(messages.RouteRule(r.stack, r.up_to) for r in rules) for a, rules in d.routes.items()}
    return web.json_response(asdict(messages.DesiredState(d.stacks, d.aliases, d.fallbacks, d.parked, routes)))


async def events(request: web.Request) -> web.StreamResponse:
    bus = request.app[COMMANDS].bus
    try:
        since = int(request.headers.get("Last-Event-ID") or request.query.get("since", bus.last))
    except ValueError:
        raise http.bad(400, "`since` must be an event number") from None
    response, write = await http.lines(request)
    while (events := await http.unless_closing(request, bus.wait_after(since, timeout=15))) is not None:
        for event in events:
            since = event["seq"]
            await write(event, event["seq"])
        if not events:
            await write(None)  # a keep-alive: a browser that left is noticed
    await response.write_eof()
    return response


async def logs(request: web.Request) -> web.StreamResponse:
    """The stack's engine log, its last `tail` lines then each new one, until the client leaves.
    Docker's stream is read on the loop, so a follow holds no worker thread; with no new line for
    `KEEPALIVE` seconds a keep-alive is written, so a client that left is noticed without one."""
    try:
        tail = min(10_000, max(1, int(request.query.get("tail", "200"))))
    except ValueError:
        raise http.bad(400, "`tail` must be a number of lines") from None
    with request.app[FOLLOWS].held():
        stream = await blocking(request.app[QUERIES].logs, request.query.get("stack", ""), tail)
        async with contextlib.aclosing(stream):
            await anext(stream)  # Docker accepted the follow: a refusal is answered as an error, not a cut stream
            response, write = await http.lines(request)
            next_chunk = asyncio.ensure_future(anext(stream, None))
            try:
                while (done := await http.unless_closing(request, _within(next_chunk, KEEPALIVE))) is not None:
                    if not done:
                        await write(None)
                        continue
                    if (chunk := next_chunk.result()) is None:
                        break
                    next_chunk = asyncio.ensure_future(anext(stream, None))
                    for line in redact(chunk.decode(errors="replace")).splitlines():
                        await write({"line": line})
            finally:  # the pending read is over before the stream closes
                next_chunk.cancel()
                await asyncio.gather(next_chunk, return_exceptions=True)
    await response.write_eof()
    return response


async def _within(step: asyncio.Future, seconds: float) -> bool:
    """Whether `step` is done within `seconds`; it goes on either way."""
    await asyncio.wait({step}, timeout=seconds)
    return step.done()


async def report_file(request: web.Request) -> web.FileResponse:
    path = await blocking(request.app[QUERIES].report_file, request.query.get("report", ""),
                                   request.query.get("path", ""))
    return web.FileResponse(path, headers={"Content-Type": TYPES.get(path.suffix, "application/octet-stream"),
                                           "X-Content-Type-Options": "nosniff"})


async def history(request: web.Request) -> web.Response:
    found = await blocking(request.app[QUERIES].history, request.query.get("stack"))
    return web.json_response(asdict(found))


async def chart(request: web.Request) -> web.Response:
    """One of the dashboard's charts, as SVG (`?name=tps|ttft|requests|memory`)."""
    svg = await blocking(request.app[QUERIES].chart, request.query.get("name", ""))
    return web.Response(text=svg, content_type="image/svg+xml", headers={"Cache-Control": "no-store",
                                                                         "X-Content-Type-Options": "nosniff"})


async def metrics(request: web.Request) -> web.Response:
    return web.Response(text=await blocking(request.app[QUERIES].metrics_text), content_type="text/plain")
