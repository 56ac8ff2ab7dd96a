"""The gateway's HTTP side (aiohttp): OpenAI routes proxied to the stack a model names.

Streaming responses are passed through chunk by chunk as they arrive; a client that goes away
cancels its upstream request. A stack's concurrency cap queues requests rather than forwarding
them. During a switch an alias can be held (`hold.py`): its new requests wait until the alias
points at a serving stack again, and `drain` waits for a stack's accepted requests to finish.
Errors the gateway itself raises use the OpenAI envelope with `"source": "sparkctl"`, so an
agent can tell them from the model server's. Optional API keys are compared in constant time.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections import defaultdict
from collections.abc import Callable

from aiohttp import ClientError, web

from sparkctl.gateway.hold import Hold
from sparkctl.gateway.routes import RouteTable, Upstream
from sparkctl.gateway.upstream import UpstreamError, Upstreams

MAX_BODY = 32 * 1024 * 1024
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive"}
RETRY_AFTER = "5"  # seconds, in the 503 of a request refused while its alias switches


class Gateway:
    def __init__(self, routes: Callable[[], RouteTable], *, api_keys: list[str] | None = None) -> None:
        self.routes = routes
        self.api_keys = [k.encode() for k in api_keys or []]
        self.caps: dict[str, asyncio.Semaphore] = {}
        self.in_flight: defaultdict[str, int] = defaultdict(int)  # forwarded upstream now
        self.accepted: defaultdict[str, int] = defaultdict(int)  # routed and not finished (incl. queued at a cap)
        self.peak: defaultdict[str, int] = defaultdict(int)  # most requests ever in flight at once
        self.served: defaultdict[tuple[str, int], int] = defaultdict(int)  # (stack, status) -> count
        self.upstreams = Upstreams()  # keep-alive connections to the engines
        self.holds: dict[str, Hold] = {}  # alias -> its hold while it switches

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._auth] if self.api_keys else [])
        app.router.add_post("/v1/chat/completions", self.proxy)
        app.router.add_post("/v1/completions", self.proxy)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.on_cleanup.append(self._close)
        return app

    # --- a switch's hold and drain (called on the gateway's loop) --------------------------
    def hold(self, alias: str, old: str | None, new: str, *, limit: int, timeout: float) -> None:
        self.holds[alias] = Hold(alias, old, new, limit=limit, timeout=timeout)

    def release(self, alias: str) -> dict[str, float]:
        """Let the alias's held requests go, in order; the routes must already name its new stack."""
        hold = self.holds.pop(alias)
        held = len(hold.waiting)
        hold.release()
        return {"held_requests": held, "refused_requests": hold.refused,
                "hold_s": round(time.monotonic() - hold.since, 3)}

    async def drain(self, stack: str, timeout: float) -> bool:
        """Wait until the stack has no accepted request left; False if `timeout` passed first."""
        deadline = time.monotonic() + timeout
        while self.accepted[stack] > 0:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    # --- routes ------------------------------------------------------------------------------
    async def health(self, _: web.Request) -> web.Response:
        body: dict[str, object] = {"status": "ok", "models": len(self.routes().models())}
        if self.holds:
            body["switching"] = [h.describe() for h in self.holds.values()]
        return web.json_response(body)

    async def models(self, _: web.Request) -> web.Response:
        cards = self.routes().models()
        listed = {c["id"] for c in cards}
        for hold in self.holds.values():  # a held alias stays listed, marked as switching
            cards = [c | {"switching": hold.describe()} if c["id"] == hold.alias else c for c in cards]
            if hold.alias not in listed:
                cards.insert(0, {"id": hold.alias, "object": "model", "owned_by": "sparkctl", "root": hold.new,
                                 "switching": hold.describe()})
        return web.json_response({"object": "list", "data": cards})

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error(400, "request body is not valid JSON", "invalid_request_error")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return error(400, "request body must be a JSON object with a string `model`", "invalid_request_error")
        hold = self.holds.get(body["model"])
        if hold is not None and (refused := await hold.wait()) is not None:
            return error(503, f"{refused}; retry shortly", "switch_in_progress", headers={"Retry-After": RETRY_AFTER})
        upstream = self.routes().resolve(body["model"])
        if upstream is None:
            return error(404, f"The model `{body['model']}` does not exist here; GET /v1/models lists what does.",
                         "model_not_found")
        body["model"] = upstream.served_name
        async with self._slot(upstream.stack, upstream.max_concurrency):
            return await self._forward(request, upstream, body)

    async def _forward(self, request: web.Request, upstream: Upstream, body: dict) -> web.StreamResponse:
        stack = upstream.stack
        try:
            reply = await self.upstreams.post(upstream.url, request.path, json.dumps(body).encode())
        except UpstreamError as e:
            self.served[(stack, 502)] += 1
            return error(502, f"stack {stack} did not answer ({e}); see `sparkctl status`", "upstream_unavailable")
        async with reply:  # leaving it pools the connection, or closes it if the answer did not end cleanly
            self.served[(stack, reply.status)] += 1
            response = web.StreamResponse(status=reply.status,
                                          headers=[(k, v) for k, v in reply.headers if k.lower() not in HOP_HEADERS])
            response.headers["X-Sparkctl-Stack"] = stack
            await response.prepare(request)
            try:
                async for piece in reply:
                    if reply.finished:
                        await response.write_eof(piece)  # the last piece and the end in one write
                        return response
                    await response.write(piece)  # raises once the client is gone
                await response.write_eof()
            except (UpstreamError, ClientError, OSError):
                # Cut mid-stream, by either side. The client's connection is closed without the
                # response's end, so it knows the answer is incomplete; leaving `reply` closes the
                # engine's, so the engine stops generating.
                if request.transport is not None:
                    request.transport.close()
            return response

    def _slot(self, stack: str, cap: int | None) -> _Slot:
        if cap and stack not in self.caps:
            self.caps[stack] = asyncio.Semaphore(cap)
        return _Slot(self, stack, self.caps.get(stack) if cap else None)

    async def metrics(self, _: web.Request) -> web.Response:
        lines = ["# TYPE sparkctl_gateway_requests_total counter"]
        lines += [f'sparkctl_gateway_requests_total{{stack="{s}",status="{c}"}} {n}'
                  for (s, c), n in sorted(self.served.items())]
        lines.append("# TYPE sparkctl_gateway_in_flight gauge")
        lines += [f'sparkctl_gateway_in_flight{{stack="{s}"}} {n}' for s, n in sorted(self.in_flight.items())]
        lines.append("# TYPE sparkctl_gateway_held gauge")
        lines += [f'sparkctl_gateway_held{{alias="{a}"}} {len(h.waiting)}' for a, h in sorted(self.holds.items())]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    @web.middleware
    async def _auth(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        if request.path.startswith("/v1/"):
            given = request.headers.get("Authorization", "").removeprefix("Bearer ").encode()
            if not any(hmac.compare_digest(given, key) for key in self.api_keys):
                return error(401, "missing or wrong API key", "invalid_api_key")
        return await handler(request)

    async def _close(self, _: web.Application) -> None:
        self.upstreams.close()


class _Slot:
    """Counts a request in flight and, under a cap, waits for a free slot first."""

    def __init__(self, gateway: Gateway, stack: str, semaphore: asyncio.Semaphore | None) -> None:
        self.gateway, self.stack, self.semaphore = gateway, stack, semaphore

    async def __aenter__(self) -> None:
        self.gateway.accepted[self.stack] += 1  # before any wait: a drain must see it
        if self.semaphore is not None:
            try:
                await self.semaphore.acquire()
            except BaseException:
                self.gateway.accepted[self.stack] -= 1
                raise
        self.gateway.in_flight[self.stack] += 1
        self.gateway.peak[self.stack] = max(self.gateway.peak[self.stack], self.gateway.in_flight[self.stack])

    async def __aexit__(self, *_: object) -> None:
        self.gateway.in_flight[self.stack] -= 1
        self.gateway.accepted[self.stack] -= 1
        if self.semaphore is not None:
            self.semaphore.release()


def error(status: int, message: str, code: str, *, headers: dict[str, str] | None = None) -> web.Response:
    """The OpenAI error envelope, marked as coming from sparkctl rather than the model server."""
    return web.json_response({"error": {"message": message, "type": code, "param": None, "code": code,
                                        "source": "sparkctl"}}, status=status, headers=headers)


class LoopControl:
    """The gateway's hold, release and drain for a caller on another thread (the switch's)."""

    def __init__(self, gateway: Gateway, loop: asyncio.AbstractEventLoop, *, hold_queue: int, hold_timeout: float,
                 drain_timeout: float) -> None:
        self.gateway, self.loop = gateway, loop
        self.hold_queue, self.hold_timeout, self.drain_timeout = hold_queue, hold_timeout, drain_timeout

    def hold(self, alias: str, old: str | None, new: str) -> None:
        self._call(lambda: self.gateway.hold(alias, old, new, limit=self.hold_queue, timeout=self.hold_timeout))

    def release(self, alias: str) -> dict[str, float]:
        return self._call(lambda: self.gateway.release(alias))

    def drain(self, stack: str) -> bool:
        return asyncio.run_coroutine_threadsafe(self.gateway.drain(stack, self.drain_timeout), self.loop).result()

    def _call(self, fn: Callable):
        async def on_loop():
            return fn()

        return asyncio.run_coroutine_threadsafe(on_loop(), self.loop).result()
