"""The gateway's OpenAI routes: each request proxied to the stack its model names.

Routing and forwarding happen in the socket's callback as the request completes (`server.py`),
and each piece of the engine's answer is written to the client from the engine socket's callback
(`upstream.py`), so a streamed response is passed through as it arrives, with nothing queued in
between. A client that goes away cancels its upstream request. A stack's concurrency cap queues
requests rather than forwarding them. During a switch an alias can be held (`hold.py`): its new
requests wait until the alias points at a serving stack again, and `drain` waits for a stack's
accepted requests to finish. Errors the gateway itself raises use the OpenAI envelope with
`"source": "sparkctl"`, so an agent can tell them from the model server's. Optional API keys are
compared in constant time.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
import time
from collections import defaultdict, deque
from collections.abc import Callable, Coroutine, Sequence

from sparkctl.gateway.hold import Hold
from sparkctl.gateway.routes import RouteTable, Upstream
from sparkctl.gateway.server import Answer, Connection, Limits, Request, serve
from sparkctl.gateway.upstream import Call, EnginePool, UpstreamError

HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive"}
RETRY_AFTER = "5"  # seconds, in the 503 of a request refused while its alias switches
PROXIED = ("/v1/chat/completions", "/v1/completions")


class Gateway:
    def __init__(self, routes: Callable[[], RouteTable], *, api_keys: list[str] | None = None,
                 hosts: Sequence[str] | None = None, metrics_key: bool = False, limits: Limits | None = None) -> None:
        self.routes = routes
        self.api_keys = [k.encode() for k in api_keys or []]
        # The names clients may reach it by (DNS-rebinding protection for a loopback service); None: any.
        self.hosts = {h.lower() for h in hosts} if hosts is not None else None
        self.keyed = ("/v1/", "/metrics") if metrics_key else ("/v1/",)
        self.limits = limits or Limits()
        self.caps: dict[str, _Cap] = {}
        self.in_flight: defaultdict[str, int] = defaultdict(int)  # forwarded upstream now
        self.accepted: defaultdict[str, int] = defaultdict(int)  # routed and not finished (incl. queued at a cap)
        self.peak: defaultdict[str, int] = defaultdict(int)  # most requests ever in flight at once
        self.served: defaultdict[tuple[str, int], int] = defaultdict(int)  # (stack, status) -> count
        self.upstreams = EnginePool()  # keep-alive connections to the engines
        self.holds: dict[str, Hold] = {}  # alias -> its hold while it switches
        self.drained: dict[str, asyncio.Event] = {}  # stack -> set when its last accepted request finishes
        self.pages = {"/v1/models": self.models, "/health": self.health, "/metrics": self.metrics}

    async def serve(self, host: str, port: int, *, sock: socket.socket | None = None) -> asyncio.Server:
        return await serve(self.handle, host, port, admit=self.admit, limits=self.limits, sock=sock)

    def close(self) -> None:
        self.upstreams.close()

    def admit(self, request: Request) -> Answer | None:
        """Checked when a request's head is complete, before any of its body is read."""
        host = request.headers.get("host")
        if self.hosts is not None and host is not None and _hostname(host) not in self.hosts:
            return lambda conn: error(conn, 421, f"Host {host[:60]!r} is not one of this gateway's names "
                                      "(SPARKCTL_GATEWAY_HOSTNAMES)", "misdirected_request")
        if self.api_keys and request.path.startswith(self.keyed) and not self._authorized(request):
            return lambda conn: error(conn, 401, "missing or wrong API key", "invalid_api_key")
        return None

    def handle(self, request: Request, conn: Connection) -> None:
        if request.path in PROXIED and request.method == "POST":
            self.proxy(request, conn)
        elif request.path in self.pages and request.method == "GET":
            self.pages[request.path](conn)
        elif request.path in PROXIED or request.path in self.pages:
            error(conn, 405, f"{request.method} is not allowed on {request.path}", "method_not_allowed")
        else:
            error(conn, 404, f"no route {request.path}", "not_found")

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

    async def finish(self, timeout: float) -> bool:
        """A graceful stop (the listener already closed): every connection closes after its next
        answer, and this waits until all have; False if `timeout` passed first."""
        self.limits.finish()
        deadline = time.monotonic() + timeout
        while self.limits.live:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def drain(self, stack: str, timeout: float) -> bool:
        """Wait until the stack has no accepted request left; False if `timeout` passed first."""
        if not self.accepted[stack]:
            return True
        drained = self.drained.setdefault(stack, asyncio.Event())  # set by the last one to finish
        try:
            await asyncio.wait_for(drained.wait(), timeout)
        except TimeoutError:
            return False
        return True

    # --- pages -------------------------------------------------------------------------------
    def health(self, conn: Connection) -> None:
        body: dict[str, object] = {"status": "ok", "models": len(self.routes().models())}
        if self.holds:
            body["switching"] = [h.describe() for h in self.holds.values()]
        conn.reply_json(200, body)

    def models(self, conn: Connection) -> None:
        cards = self.routes().models()
        listed = {c["id"] for c in cards}
        for hold in self.holds.values():  # a held alias stays listed, marked as switching
            cards = [c | {"switching": hold.describe()} if c["id"] == hold.alias else c for c in cards]
            if hold.alias not in listed:
                cards.insert(0, {"id": hold.alias, "object": "model", "owned_by": "sparkctl", "root": hold.new,
                                 "switching": hold.describe()})
        conn.reply_json(200, {"object": "list", "data": cards})

    def metrics(self, conn: Connection) -> None:
        lines = ["# TYPE sparkctl_gateway_requests_total counter"]
        lines += [f'sparkctl_gateway_requests_total{{stack="{s}",status="{c}"}} {n}'
                  for (s, c), n in sorted(self.served.items())]
        lines.append("# TYPE sparkctl_gateway_in_flight gauge")
        lines += [f'sparkctl_gateway_in_flight{{stack="{s}"}} {n}' for s, n in sorted(self.in_flight.items())]
        lines.append("# TYPE sparkctl_gateway_held gauge")
        lines += [f'sparkctl_gateway_held{{alias="{a}"}} {len(h.waiting)}' for a, h in sorted(self.holds.items())]
        conn.reply(200, ("\n".join(lines) + "\n").encode(), "text/plain; charset=utf-8")

    # --- proxying ------------------------------------------------------------------------------
    def proxy(self, request: Request, conn: Connection) -> None:
        """Route and forward at once, from the socket's callback; only a hold or a full cap waits."""
        try:
            body = json.loads(request.body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            error(conn, 400, "request body is not valid JSON", "invalid_request_error")
            return
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            error(conn, 400, "request body must be a JSON object with a string `model`", "invalid_request_error")
            return
        exchange = conn.exchange = _Proxied(self, conn, request.path, body)
        hold = self.holds.get(body["model"])
        if hold is not None:
            exchange.wait(self._after_hold(exchange, hold))
        else:
            self._route(exchange)

    async def _after_hold(self, exchange: _Proxied, hold: Hold) -> None:
        refused = await hold.wait()
        if refused is not None:
            error(exchange.conn, 503, f"{refused}; retry shortly", "switch_in_progress",
                  headers=[("Retry-After", RETRY_AFTER)])
        else:
            self._route(exchange)

    def _route(self, exchange: _Proxied) -> None:
        model = exchange.payload["model"]
        upstream = self.routes().resolve(model)
        if upstream is None:
            error(exchange.conn, 404, f"The model `{model}` does not exist here; GET /v1/models lists what does.",
                  "model_not_found")
            return
        exchange.payload["model"] = upstream.served_name
        exchange.upstream = upstream
        self.accepted[upstream.stack] += 1  # before any wait: a drain must see it
        cap = self._cap(upstream)
        if cap is None or cap.take():
            self._forward(exchange)
        else:
            exchange.wait(self._after_cap(exchange, cap))

    async def _after_cap(self, exchange: _Proxied, cap: _Cap) -> None:
        await cap.wait()
        self._forward(exchange)

    def _forward(self, exchange: _Proxied) -> None:
        stack = exchange.upstream.stack
        self.in_flight[stack] += 1
        self.peak[stack] = max(self.peak[stack], self.in_flight[stack])
        exchange.forwarded = True
        exchange.call = self.upstreams.post(exchange.upstream.url, exchange.path, json.dumps(exchange.payload).encode(),
                                            exchange)
        if exchange.conn.paused:
            exchange.call.pause()

    def _cap(self, upstream: Upstream) -> _Cap | None:
        if not upstream.max_concurrency:
            return None
        cap = self.caps.get(upstream.stack)
        if cap is None:
            cap = self.caps[upstream.stack] = _Cap(upstream.max_concurrency)
        return cap

    def _finished(self, exchange: _Proxied) -> None:
        stack = exchange.upstream.stack
        if exchange.forwarded:
            self.in_flight[stack] -= 1
            if (cap := self.caps.get(stack)) is not None:
                cap.give()
        self.accepted[stack] -= 1
        if not self.accepted[stack] and (drained := self.drained.pop(stack, None)) is not None:
            drained.set()

    def _authorized(self, request: Request) -> bool:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        secret = given.strip().encode("latin-1")
        return any(hmac.compare_digest(secret, key) for key in self.api_keys)


class _Proxied:
    """One proxied request, from routing until its answer has been passed on, failed or been
    abandoned by its client. It is the upstream call's sink and the client connection's exchange."""

    def __init__(self, gateway: Gateway, conn: Connection, path: str, payload: dict) -> None:
        self.gateway, self.conn, self.path, self.payload = gateway, conn, path, payload
        self.upstream: Upstream | None = None  # once routed
        self.task: asyncio.Task[None] | None = None  # while it waits at a hold or a cap
        self.call: Call | None = None  # once forwarded
        self.forwarded = self.started = self.over = False

    def wait(self, step: Coroutine[None, None, None]) -> None:
        self.task = asyncio.ensure_future(step)

    # --- the upstream call's sink --------------------------------------------------------------
    def head(self, status: int, headers: list[tuple[str, str]], length: int | None) -> None:
        self.gateway.served[(self.upstream.stack, status)] += 1
        self.started = True
        kept = [(k, v) for k, v in headers if k.lower() not in HOP_HEADERS]
        self.conn.start(status, [*kept, ("X-Sparkctl-Stack", self.upstream.stack)], length)

    def body(self, piece: bytes, last: bool) -> None:
        if last:
            self._finish()
        self.conn.send(piece, last)

    def failed(self, e: UpstreamError) -> None:
        self._finish()
        if self.started:  # cut mid-stream: the client's connection closes without the response's end
            self.conn.abort()
        else:
            stack = self.upstream.stack
            self.gateway.served[(stack, 502)] += 1
            error(self.conn, 502, f"stack {stack} did not answer ({e}); see `sparkctl status`", "upstream_unavailable")

    # --- the client connection's exchange --------------------------------------------------------
    def cancel(self) -> None:
        """The client went away: stop waiting, or close the engine's connection so it stops."""
        if self.task is not None:
            self.task.cancel()
        if self.call is not None:
            self.call.cancel()
        self._finish()

    def pause(self) -> None:
        if self.call is not None:
            self.call.pause()

    def resume(self) -> None:
        if self.call is not None:
            self.call.resume()

    def _finish(self) -> None:
        if not self.over and self.upstream is not None:
            self.gateway._finished(self)
        self.over = True


class _Cap:
    """A stack's concurrency cap: slots taken at once while free, else waited for in order."""

    def __init__(self, size: int) -> None:
        self.free = size
        self.waiting: deque[asyncio.Future[None]] = deque()

    def take(self) -> bool:
        if self.free > 0:
            self.free -= 1
            return True
        return False

    async def wait(self) -> None:
        slot = asyncio.get_running_loop().create_future()
        self.waiting.append(slot)
        try:
            await slot
        except asyncio.CancelledError:
            if slot.done() and not slot.cancelled():
                self.give()  # the slot was handed over as the waiter left: pass it on
            else:
                self.waiting.remove(slot)
            raise

    def give(self) -> None:
        """A slot comes free: to the first waiter, else back to the pool."""
        while self.waiting:
            slot = self.waiting.popleft()
            if not slot.done():
                slot.set_result(None)
                return
        self.free += 1


def _hostname(host: str) -> str:
    """The name in a Host header, without its port (`[::1]:8000` -> `[::1]`)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def error(conn: Connection, status: int, message: str, code: str, *, headers: Sequence[tuple[str, str]] = ()) -> None:
    """The OpenAI error envelope, marked as coming from sparkctl rather than the model server."""
    conn.reply_json(status, {"error": {"message": message, "type": code, "param": None, "code": code,
                                       "source": "sparkctl"}}, headers)


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
