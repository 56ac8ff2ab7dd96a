"""What every handler of the API shares: bodies parsed (a 400 for anything else), the one error
envelope, the bearer check of the TCP listener, and the long-lived streams (NDJSON, or
server-sent events for a browser) that end as the API stops."""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from sparkctl import messages
from sparkctl.daemon.api.service import CLOSING
from sparkctl.errors import NoSuchFile, NoSuchStack, SparkctlError

MAX_BODY = 64 * 1024


async def closing(app: web.Application) -> None:
    app[CLOSING].set()


async def unless_closing(request: web.Request, step: Any) -> Any:
    """`step`'s result, or None once the API is stopping (a long-lived stream ends then)."""
    waiting, closing = asyncio.ensure_future(step), asyncio.ensure_future(request.app[CLOSING].wait())
    await asyncio.wait({waiting, closing}, return_when=asyncio.FIRST_COMPLETED)
    closing.cancel()
    if waiting.done():
        return waiting.result()
    waiting.cancel()
    return None


async def lines(request: web.Request) -> tuple[web.StreamResponse, Callable[..., Any]]:
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


async def ndjson(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    return response


async def parse_body(request: web.Request, kind: type[messages.Request]) -> Any:
    return messages.parse(kind, await json_body(request))


async def json_body(request: web.Request) -> Any:
    """The request's JSON body; a 400 for anything else: not UTF-8, not JSON, an integer over
    Python's 4,300 digits (a ValueError), nesting too deep (a RecursionError)."""
    try:
        return json.loads(await request.read())
    except (ValueError, RecursionError):
        raise bad(400, "request body is not valid JSON") from None


def bad(status: int, message: str, kind: str = "bad_request") -> web.HTTPException:
    """The one error envelope: `{"error": {"message", "type"}}` with its status."""
    cls = {400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 404: web.HTTPNotFound}.get(status,
                                                                                        web.HTTPInternalServerError)
    return cls(text=json.dumps({"error": {"message": message, "type": kind}}), content_type="application/json")


def bearer(token: str) -> Callable:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Callable) -> web.StreamResponse:
        if len(request.headers.getall("Authorization", [])) > 1:  # a proxy in front may have checked another
            raise bad(400, "more than one Authorization header: send the API token once")
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, expected):
            raise bad(401, "missing or wrong API token", "unauthorized")
        return await handler(request)

    return check


@web.middleware
async def errors(request: web.Request, handler: Callable) -> web.StreamResponse:
    """Errors to HTTP, by type, in one place."""
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY, actual_size=0, content_type="application/json",
                                            text=json.dumps({"error": {"message": f"request body over {MAX_BODY} "
                                                                       "bytes", "type": "too_large"}})) from None
    except (NoSuchStack, NoSuchFile) as e:
        raise bad(404, str(e), "sparkctl_error") from None
    except messages.BadRequest as e:
        raise bad(400, str(e)) from None
    except SparkctlError as e:
        raise bad(400, str(e), "sparkctl_error") from None
