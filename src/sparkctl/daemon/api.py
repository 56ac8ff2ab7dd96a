"""The daemon's local API: HTTP over a unix socket in the state dir (mode 0600), for the CLI.

Routes: GET /v1/status, GET /v1/desired, POST /v1/up, POST /v1/down, POST /v1/switch (these
stream NDJSON events until the outcome), GET /v1/events?since=N (NDJSON, long-lived), GET /v1/history,
GET /metrics. Errors are JSON `{"error": {"message", "type"}}`; a bad request never stops the
daemon.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sparkctl.daemon.events import STREAMED, Finished
from sparkctl.errors import NoSuchStack, SparkctlError
from sparkctl.log import redact

if TYPE_CHECKING:
    from sparkctl.daemon.app import Daemon

MAX_BODY = 64 * 1024


def build(daemon: Daemon, *, token: str | None = None) -> web.Application:
    """The API app; with `token`, every request must carry `Authorization: Bearer <token>`."""
    app = web.Application(client_max_size=MAX_BODY, middlewares=[_errors] + ([_bearer(token)] if token else []))
    app["daemon"] = daemon
    app["turns"] = defaultdict(asyncio.Lock)  # per stack: up/down calls take effect in arrival order
    app.router.add_get("/v1/status", status)
    app.router.add_get("/v1/desired", desired)
    app.router.add_post("/v1/up", up)
    app.router.add_post("/v1/down", down)
    app.router.add_post("/v1/switch", switch)
    app.router.add_get("/v1/events", events)
    app.router.add_get("/v1/history", history)
    app.router.add_get("/metrics", metrics)
    return app


async def status(request: web.Request) -> web.Response:
    return web.json_response(await asyncio.to_thread(request.app["daemon"].status))


async def desired(request: web.Request) -> web.Response:
    d = await asyncio.to_thread(request.app["daemon"].machine.desired)
    return web.json_response({"stacks": list(d.stacks), "aliases": d.aliases, "fallbacks": d.fallbacks})


async def up(request: web.Request) -> web.StreamResponse:
    body = await _body(request, required=("stack",))
    daemon = request.app["daemon"]
    flags = {"refresh": bool(body.get("refresh")), "replace": bool(body.get("replace"))}
    async with request.app["turns"][body["stack"]]:
        stack = await asyncio.to_thread(daemon.check_stack, body["stack"])
        return await _stream_action(request, (stack,), lambda: daemon.up(stack, **flags))


async def down(request: web.Request) -> web.StreamResponse:
    body = await _body(request, required=("stack",))
    daemon = request.app["daemon"]
    async with request.app["turns"][body["stack"]]:
        stack = await asyncio.to_thread(daemon.check_stack, body["stack"])
        return await _stream_action(request, (stack,), lambda: daemon.down(stack))


async def switch(request: web.Request) -> web.StreamResponse:
    body = await _body(request, required=("stack",))
    alias = body.get("alias") or "primary"
    if not isinstance(alias, str):
        raise _bad(400, "`alias` must be a string")
    daemon = request.app["daemon"]
    async with request.app["turns"][f"alias:{alias}"]:  # one switch of an alias at a time
        stack = await asyncio.to_thread(daemon.check_stack, body["stack"])
        old = (await asyncio.to_thread(daemon.machine.desired)).aliases.get(alias)
        return await _stream_action(request, (stack, alias, *filter(None, [old])),
                                    lambda: daemon.switch(alias, stack))


async def events(request: web.Request) -> web.StreamResponse:
    bus = request.app["daemon"].bus
    try:
        since = int(request.query.get("since", bus.last))
    except ValueError:
        raise _bad(400, "`since` must be an event number") from None
    response = await _ndjson(request)
    while True:
        for event in await bus.wait_after(since, timeout=15):
            since = event["seq"]
            await response.write(json.dumps(event).encode() + b"\n")


async def history(request: web.Request) -> web.Response:
    rows = await asyncio.to_thread(request.app["daemon"].history, request.query.get("stack"))
    return web.json_response(rows)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(text=await asyncio.to_thread(request.app["daemon"].metrics_text), content_type="text/plain")


async def _stream_action(request: web.Request, names: tuple[str, ...], work: Callable[[], Any]) -> web.StreamResponse:
    """Run `work` in a thread; stream the events of these stacks (or alias) meanwhile; end with the outcome."""
    stack = names[0]
    bus = request.app["daemon"].bus
    since = bus.last
    response = await _ndjson(request)

    def run() -> Any:
        try:
            return work()
        finally:
            bus.publish(Finished(stack))  # wakes the wait below at once

    task = asyncio.ensure_future(asyncio.to_thread(run))
    while True:
        done = task.done()
        for event in await bus.wait_after(since, timeout=0 if done else 15):
            since = event["seq"]
            if event.get("stack") in names and event["kind"] in STREAMED:
                await response.write(json.dumps(event).encode() + b"\n")
        if done:
            break
    error = task.exception()
    outcome: dict[str, Any] = {"kind": "outcome", "stack": stack, "ok": error is None, "time": time.time()}
    if error is not None:
        outcome["error"] = redact(str(error) if isinstance(error, SparkctlError) else f"internal error: {error!r}")
    else:
        outcome["result"] = task.result()
    await response.write(json.dumps(outcome).encode() + b"\n")
    await response.write_eof()
    return response


async def _ndjson(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    return response


async def _body(request: web.Request, *, required: tuple[str, ...]) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise _bad(400, "request body is not valid JSON") from None
    if not isinstance(body, dict) or any(not isinstance(body.get(k), str) for k in required):
        raise _bad(400, f"request body must be a JSON object with string fields: {', '.join(required)}")
    return body


def _bad(status: int, message: str, kind: str = "bad_request") -> web.HTTPException:
    """The one error envelope: `{"error": {"message", "type"}}` with its status."""
    cls = {400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 404: web.HTTPNotFound}.get(status,
                                                                                        web.HTTPInternalServerError)
    return cls(text=json.dumps({"error": {"message": message, "type": kind}}), content_type="application/json")


def _bearer(token: str) -> Callable:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Callable) -> web.StreamResponse:
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
    except NoSuchStack as e:
        raise _bad(404, str(e), "sparkctl_error") from None
    except SparkctlError as e:
        raise _bad(400, str(e), "sparkctl_error") from None
