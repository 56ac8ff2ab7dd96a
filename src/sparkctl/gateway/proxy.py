"""The gateway's OpenAI routes: each request proxied to the stack its model names.

Routing and forwarding happen in the socket's callback as the request completes (`server.py`),
and each piece of the engine's answer is written to the client from the engine socket's callback
(`exchange.py`), so a streamed response is passed through as it arrives, with nothing queued in
between. A client that goes away cancels its upstream request. A request that cannot go yet (its
alias held during a switch, its stack parked and waking, or with no replica in routing) waits in
the hold (`hold.py`) until it can or the hold times out; `drain` waits, through the `Ledger`, for
a stack's accepted requests to finish. Errors the gateway itself raises use the OpenAI envelope
(`pages.py`). Built and served by the daemon, whose switch calls these control methods on the loop.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog

from sparkctl.errors import SparkctlError
from sparkctl.gateway.access import Access, in_ui
from sparkctl.gateway.defaults import with_defaults
from sparkctl.gateway.exchange import Bounds, Proxied
from sparkctl.gateway.hold import Hold
from sparkctl.gateway.inflight import InFlight
from sparkctl.gateway.ledger import Ledger
from sparkctl.gateway.limits import Limits
from sparkctl.gateway.pages import Pages
from sparkctl.gateway.pool import EnginePool
from sparkctl.gateway.replicas import Replicas, host_of
from sparkctl.gateway.request import AS_GET, Request
from sparkctl.gateway.routes import RouteTable
from sparkctl.gateway.server import Connection, error, serve
from sparkctl.gateway.tokens import Counters
from sparkctl.gateway.ui import Dashboard
from sparkctl.policy import routing
from sparkctl.policy.routing import Rule

log = structlog.get_logger()
RETRY_AFTER = "5"  # seconds, in the 503 of a request refused while its alias switches
PROXIED = ("/v1/chat/completions", "/v1/completions")
INLINE_COUNT = 32 * 1024  # request bytes counted on the event loop; longer prompts in a thread


@dataclass(frozen=True)
class Waker:
    """How the gateway wakes a parked stack a request names: `wake(stack)` returns None once it
    serves, else why not; its requests wait as in a switch's hold."""

    wake: Callable[[str], Awaitable[str | None]]
    limit: int
    timeout: float


class Gateway:
    def __init__(self, routes: Callable[[], RouteTable], *, api_keys: list[str] | None = None,
                 hosts: Sequence[str] | None = None, metrics_key: bool = False, limits: Limits | None = None,
                 hold_queue: int = 1024, hold_timeout: float = 300.0, drain_timeout: float = 120.0,
                 bounds: Bounds = Bounds(), upstreams: EnginePool | None = None, waker: Waker | None = None,
                 counters: Counters | None = None, ui: Dashboard | None = None) -> None:
        """`bounds` limit how long each proxied request takes, `waker` wakes parked stacks on demand,
        `counters` count each stack's prompt tokens (for routed aliases), `ui` is the dashboard
        under /ui, on the keep-alive pool `upstreams`."""
        self.routes = routes
        self.access = Access(api_keys, hosts, metrics_key=metrics_key)
        self.admit = self.access.admit  # asked once a request's head is in
        self.limits = limits or Limits()
        self.replicas = Replicas(on_return=self.routes_changed)
        self.on_engine: dict[str, set[Proxied]] = {}  # engine URL -> requests forwarded to it, not yet over
        self.outages: dict[str, Hold] = {}  # stack -> its hold while none of its replicas is in routing
        self.hold_queue, self.hold_timeout, self.drain_timeout = hold_queue, hold_timeout, drain_timeout
        self.ledger = Ledger()
        self.upstreams = upstreams or EnginePool()  # keep-alive connections to the engines
        self.bounds = bounds
        self.inflight = InFlight(self.on_engine, self.replicas, self.ledger, upstreams=self.upstreams,
                                 route=self._route)
        self.holds: dict[str, Hold] = {}  # alias -> its hold while it switches (or a parked name's, while it wakes)
        self.waker = waker
        self.waking: dict[str, asyncio.Task] = {}  # stack -> its wake on demand
        self.counters = counters
        self.refusing: dict[str, tuple[str, float]] = {}  # stack -> why, until (monotonic): the sentinel's
        self.pages = Pages(routes, self.holds, self.ledger).by_path
        self.ui = ui

    async def serve(self, host: str, port: int, *, sock: socket.socket | None = None) -> asyncio.Server:
        return await serve(self.handle, host, port, admit=self.admit, limits=self.limits, owner=self.owner, sock=sock)

    def owner(self, request: Request) -> bool:
        """Whether a request is the owner's (let in past the connection cap): it carries an API key,
        or the dashboard's login session."""
        return self.access.carries_key(request) or (self.ui is not None and self.ui.owner(request))

    def close(self) -> None:
        self.upstreams.close()

    def handle(self, request: Request, conn: Connection) -> None:
        if request.path in PROXIED and request.method == "POST":
            self.proxy(request, conn)
        elif request.path in self.pages and request.method in AS_GET:
            self.pages[request.path](conn)
        elif self.ui is not None and in_ui(request.path):
            self.ui.handle(request, conn)
        elif request.path in PROXIED or request.path in self.pages:
            error(conn, 405, f"{request.method} is not allowed on {request.path}", "method_not_allowed")
        else:
            error(conn, 404, f"no route {request.path}", "not_found")

    # --- a switch's hold and drain (called on the gateway's loop) --------------------------
    def hold(self, alias: str, old: str | None, new: str) -> None:
        """Hold the alias's new requests (at most `hold_queue`, each `hold_timeout` s) until `release`."""
        self.holds[alias] = Hold(alias, old, new, limit=self.hold_queue, timeout=self.hold_timeout)

    def release(self, alias: str) -> dict[str, float]:
        """Let the alias's held requests go, in order; the routes must already name its new stack."""
        hold = self.holds.pop(alias)
        held = len(hold.waiting)
        hold.release()
        return {"held_requests": held, "refused_requests": hold.refused,
                "hold_s": round(time.monotonic() - hold.since, 3)}

    async def finish(self, timeout: float) -> bool:
        """A graceful stop (the listener already closed): every connection closes after its next
        answer, and this waits until all have; False if `timeout` passed first. Held requests
        (a switch, a wake) are answered 503 at once: their clients retry against the next daemon."""
        self.limits.finish()
        for hold in [*self.holds.values(), *self.outages.values()]:
            hold.fail("the gateway is stopping")
        try:
            await asyncio.wait_for(self.limits.none_open.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def drain(self, stack: str, timeout: float | None = None) -> bool:
        """Wait until the stack has no accepted request left; False if `timeout` (default: the
        gateway's `drain_timeout`) passed first."""
        return await self.ledger.wait_drained(stack, self.drain_timeout if timeout is None else timeout)

    def quiet_since(self, stack: str) -> float | None:
        """When the stack's last request through the gateway finished."""
        return self.ledger.quiet_since(stack)

    # --- replicas in and out of routing (called on the gateway's loop) ---------------------------
    def eject_host(self, address: str) -> None:
        """Take every replica on the host at `address` out of routing (its host is dead), move the
        requests forwarded there that have no answer yet to other replicas (or hold them), and end
        the answers under way there: nothing more of them will come."""
        self.replicas.eject_host(address)
        self.inflight.evacuate([u for u in self.on_engine if host_of(u) == address], f"host {address} left routing")

    def eject_engine(self, url: str) -> None:
        """Take one engine out of routing until `restore_engine` (a multi-node group that failed
        its probe, to be recreated whole), moving or ending its requests as `eject_host` does."""
        self.replicas.hold_out(url)
        self.inflight.evacuate([url], "its engine failed its probe")

    def restore_engine(self, url: str) -> None:
        self.replicas.restore(url)

    def refuse(self, stack: str, reason: str, seconds: float) -> None:
        """Answer the stack's new requests 503 (Retry-After: `seconds`) for `seconds`, a parked
        one's without waking it: the sentinel's answer to memory pressure."""
        self.refusing[stack] = (reason, time.monotonic() + seconds)

    def restore_host(self, address: str) -> None:
        """The host's replicas are back in routing; requests held for them go."""
        self.replicas.restore_host(address)

    def routes_changed(self) -> None:
        """A replica came back, or the route table changed: let go the requests held for stacks that
        now have a replica in routing (or no longer exist), to be routed again."""
        table = self.routes()
        for stack, hold in list(self.outages.items()):
            upstream = table.upstreams.get(stack)
            if upstream is None or self.replicas.live(upstream):
                del self.outages[stack]
                hold.release()

    # --- proxying ------------------------------------------------------------------------------
    def proxy(self, request: Request, conn: Connection) -> None:
        """Route and forward at once, from the socket's callback; only a hold or a full cap waits."""
        try:
            body = json.loads(request.body)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, an integer over 4,300 digits, too deep
            error(conn, 400, "request body is not valid JSON", "invalid_request_error")
            return
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            error(conn, 400, "request body must be a JSON object with a string `model`", "invalid_request_error")
            return
        exchange = conn.exchange = Proxied(conn, request.path, body, ledger=self.ledger, done=self.inflight.finished,
                                           retry=self.inflight.retry, size=len(request.body), bounds=self.bounds)
        hold = self.holds.get(body["model"])
        if hold is not None:
            exchange.wait(self._after_hold(exchange, hold))
        else:
            self._route(exchange)

    async def _after_hold(self, exchange: Proxied, hold: Hold) -> None:
        refused = await hold.wait()
        if refused is not None:
            exchange.refuse(503, f"{refused}; retry shortly", hold.code, headers=[("Retry-After", RETRY_AFTER)])
        else:
            self._route(exchange)

    def _route(self, exchange: Proxied) -> None:
        model = exchange.model
        table = self.routes()
        rules = table.rules.get(model)
        if rules is not None:
            exchange.wait(self._by_length(exchange, rules))
            return
        upstream = table.resolve(model)
        if self._refused(exchange, upstream.stack if upstream else table.parked.get(model)):
            return
        if upstream is None and model in table.parked and self.waker is not None:
            exchange.wait(self._after_hold(exchange, self._wake(model, table.parked[model])))
            return
        if upstream is None:
            exchange.refuse(404, f"The model `{model}` does not exist here; GET /v1/models lists what does.",
                            "model_not_found")
            return
        if not self.replicas.live(upstream):  # every replica ejected: wait for one to come back
            exchange.wait(self._after_hold(exchange, self._outage(upstream.stack)))
            return
        exchange.payload = with_defaults(exchange.payload, upstream.request_defaults)
        exchange.payload["model"] = upstream.served_name
        exchange.upstream = upstream
        self.inflight.send(exchange)

    def _refused(self, exchange: Proxied, stack: str | None) -> bool:
        reason, until = self.refusing.get(stack or "", ("", 0.0))
        if (left := until - time.monotonic()) <= 0:
            return False
        error(exchange.conn, 503, f"{stack} admits no new request: {reason}; retry later", "memory_pressure",
              headers=[("Retry-After", str(math.ceil(left)))])
        return True

    async def _by_length(self, exchange: Proxied, rules: tuple[Rule, ...]) -> None:
        """Route a routed alias's request to its rule's stack, by the prompt's tokens; a prompt
        that cannot be counted goes to the last rule's stack, which takes any length."""
        alias, first = exchange.model, rules[0]
        try:
            index = routing.pick(rules, await self._tokens(exchange, first.stack, first.up_to or 0))
        except Exception as e:  # noqa: BLE001 - the request is served even when it cannot be counted
            log.warning("route_count_failed", alias=alias, stack=first.stack, error=str(e))
            index = len(rules) - 1
        self.ledger.routed(alias, index, rules[index].stack)
        exchange.model = rules[index].stack
        self._route(exchange)

    async def _tokens(self, exchange: Proxied, stack: str, limit: int) -> int:
        """The prompt's tokens by `stack`'s counter; 0 when its size alone puts it under `limit`."""
        if self.counters is None:
            raise SparkctlError("this gateway counts no tokens (no counters were given to it)")
        if not self.counters.loaded(stack):
            await asyncio.to_thread(self.counters.get, stack)
        counter, args = self.counters.get(stack), (exchange.path, exchange.payload, limit)
        tokens = counter.at_most(*args) if exchange.size < INLINE_COUNT else \
            await asyncio.to_thread(counter.at_most, *args)
        return tokens or 0

    def _outage(self, stack: str) -> Hold:
        hold = self.outages.get(stack)
        if hold is None:
            hold = self.outages[stack] = Hold(stack, None, stack, limit=self.hold_queue, timeout=self.hold_timeout,
                                              waiting_for=f"a replica of stack {stack} to come back",
                                              code="no_replica")
        return hold

    def _wake(self, name: str, stack: str) -> Hold:
        """Hold `name`'s requests while its parked stack wakes (one wake per stack)."""
        assert self.waker is not None
        hold = self.holds.get(name)
        if hold is None:
            hold = self.holds[name] = Hold(name, None, stack, limit=self.waker.limit, timeout=self.waker.timeout)
        if stack not in self.waking:
            self.waking[stack] = asyncio.get_running_loop().create_task(self._woken(stack))
        return hold

    async def _woken(self, stack: str) -> None:
        assert self.waker is not None
        try:
            failure = await self.waker.wake(stack)
        except Exception as e:  # noqa: BLE001 - its held requests must be answered whatever happened
            failure = f"waking {stack} failed: {type(e).__name__}: {e}"
        finally:
            del self.waking[stack]
        for name in [n for n, h in self.holds.items() if h.old is None and h.new == stack]:
            hold = self.holds.pop(name)
            if failure:
                hold.fail(failure)
            else:
                hold.release()
