"""The gateway's HTTP side (aiohttp): OpenAI routes proxied to the stack a model names.

Streaming responses are passed through chunk by chunk as they arrive; a client that goes away
cancels its upstream request. A stack's concurrency cap queues requests rather than forwarding
them. Errors the gateway itself raises use the OpenAI envelope with `"source": "sparkctl"`, so an
agent can tell them from the model server's. Optional API keys are compared in constant time.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections import defaultdict
from collections.abc import Callable

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

from sparkctl.gateway.routes import RouteTable

MAX_BODY = 32 * 1024 * 1024
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}


class Gateway:
    def __init__(self, routes: Callable[[], RouteTable], *, api_keys: list[str] | None = None) -> None:
        self.routes = routes
        self.api_keys = [k.encode() for k in api_keys or []]
        self.caps: dict[str, asyncio.Semaphore] = {}
        self.in_flight: defaultdict[str, int] = defaultdict(int)
        self.peak: defaultdict[str, int] = defaultdict(int)  # most requests ever in flight at once
        self.served: defaultdict[tuple[str, int], int] = defaultdict(int)  # (stack, status) -> count
        self.session: ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._auth])
        app.router.add_post("/v1/chat/completions", self.proxy)
        app.router.add_post("/v1/completions", self.proxy)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def health(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "models": len(self.routes().models())})

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": self.routes().models()})

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error(400, "request body is not valid JSON", "invalid_request_error")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return error(400, "request body must be a JSON object with a string `model`", "invalid_request_error")
        upstream = self.routes().resolve(body["model"])
        if upstream is None:
            return error(404, f"The model `{body['model']}` does not exist here; GET /v1/models lists what does.",
                         "model_not_found")
        body["model"] = upstream.served_name
        async with self._slot(upstream.stack, upstream.max_concurrency):
            return await self._forward(request, upstream.stack, f"{upstream.url}{request.path}", body)

    async def _forward(self, request: web.Request, stack: str, url: str, body: dict) -> web.StreamResponse:
        assert self.session is not None
        try:
            upstream = await self.session.post(url, json=body)
        except (ClientError, OSError, TimeoutError) as e:
            self.served[(stack, 502)] += 1
            return error(502, f"stack {stack} did not answer ({type(e).__name__}); see `sparkctl status`",
                         "upstream_unavailable")
        async with upstream:
            self.served[(stack, upstream.status)] += 1
            headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS}
            response = web.StreamResponse(status=upstream.status, headers=headers)
            await response.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)  # raises once the client is gone: the upstream is closed
            except (ClientError, OSError):
                return response  # cut mid-stream; leaving the block closes the upstream request
            await response.write_eof()
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
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    @web.middleware
    async def _auth(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        if self.api_keys and request.path.startswith("/v1/"):
            given = request.headers.get("Authorization", "").removeprefix("Bearer ").encode()
            if not any(hmac.compare_digest(given, key) for key in self.api_keys):
                return error(401, "missing or wrong API key", "invalid_api_key")
        return await handler(request)

    async def _open(self, _: web.Application) -> None:
        # Reused keep-alive connections to the engines; no overall timeout (long generations).
        self.session = ClientSession(connector=TCPConnector(limit=0, keepalive_timeout=60),
                                     timeout=ClientTimeout(total=None, sock_connect=5))

    async def _close(self, _: web.Application) -> None:
        if self.session is not None:
            await self.session.close()


class _Slot:
    """Counts a request in flight and, under a cap, waits for a free slot first."""

    def __init__(self, gateway: Gateway, stack: str, semaphore: asyncio.Semaphore | None) -> None:
        self.gateway, self.stack, self.semaphore = gateway, stack, semaphore

    async def __aenter__(self) -> None:
        if self.semaphore is not None:
            await self.semaphore.acquire()
        self.gateway.in_flight[self.stack] += 1
        self.gateway.peak[self.stack] = max(self.gateway.peak[self.stack], self.gateway.in_flight[self.stack])

    async def __aexit__(self, *_: object) -> None:
        self.gateway.in_flight[self.stack] -= 1
        if self.semaphore is not None:
            self.semaphore.release()


def error(status: int, message: str, code: str) -> web.Response:
    """The OpenAI error envelope, marked as coming from sparkctl rather than the model server."""
    return web.json_response({"error": {"message": message, "type": code, "param": None, "code": code,
                                        "source": "sparkctl"}}, status=status)
