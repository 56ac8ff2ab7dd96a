"""A fleet host's engine relays: how the head's gateway reaches an engine placed on another Spark,
without that engine ever listening beyond its host's loopback.

A placed engine binds 127.0.0.1 like any other, so vLLM's dev endpoints (`/sleep`, `/wake_up`,
`/collective_rpc`, `/reset_prefix_cache`: its `--api-key` guards only `/v1`) are never reachable
from off the host. The host's agent (`fleet/hostagent.py`) serves each one on the host's serving address,
same port, through an `EngineRelay`: a request must carry the fleet's relay credential
(`Authorization: Bearer <key>`, derived from the fleet's Ray token, which every host holds 0600)
and ask for one of the few routes the head uses; anything else is refused before its body is
read. The credential is dropped before the request goes on to the engine. An engine that does not
answer closes the head's connection unanswered, as the engine itself would have, so the head's
gateway moves the request to another replica.

Anyone on the LAN can open a connection, so what one costs before it shows the credential is
bounded (`Door`): at most `unauthenticated` such connections are held across the host's relays,
each for at most `credential_within` seconds. A newcomer is always let in, the oldest connection
of the peer holding the most being closed to make room, so a flood from one machine closes its own
connections while the head's, which sends its credential at once, get through; a connection that
showed it leaves the count (the head's keep-alive connections are bounded by its own pool).
Errors of the relays' loop (a full file table's `accept` errors among them) are logged at most once
per `LOG_EVERY` seconds each, with how many there were.

`Relays` runs a host's relays on one event loop thread of the agent's process.
"""

from __future__ import annotations

import asyncio
import hmac
import threading
import time
from collections import Counter
from typing import Any

import structlog

from sparkctl.gateway.limits import Limits
from sparkctl.gateway.passthrough import Passed
from sparkctl.gateway.pool import EnginePool
from sparkctl.gateway.request import Answer, Request
from sparkctl.gateway.server import Connection, error

log = structlog.get_logger()

# What the head asks of a placed engine: its gateway's forwards, the fleet watch's probes (health,
# and from the metrics whether it sleeps), the dashboard's counters. Nothing else of vLLM's API is passed.
ROUTES = {("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/health"),
          ("GET", "/metrics")}
PASSED_HEADERS = ("content-type", "accept")
LOG_EVERY = 10.0  # seconds between two log lines of the same loop error


class EngineRelay:
    """One engine (`engine`: its loopback URL) served to holders of `key`."""

    def __init__(self, engine: str, key: str, pool: EnginePool) -> None:
        self.engine, self.pool = engine, pool
        self.expected = f"Bearer {key}".encode()

    def admit(self, request: Request) -> Answer | None:
        given = request.headers.get("authorization", "").encode("latin-1", "replace")
        if not hmac.compare_digest(given, self.expected):
            return lambda conn: error(conn, 401, "this engine is reached through the fleet's gateway only",
                                      "invalid_api_key")
        if (request.method, request.path) not in ROUTES:
            return lambda conn: error(conn, 404, f"{request.method} {request.path[:80]} is not relayed", "not_found")
        return None

    def handle(self, request: Request, conn: Connection) -> None:
        passed = conn.exchange = Passed(conn, lambda conn, _e: conn.abort())
        headers = [(k, v) for k, v in request.headers.items() if k in PASSED_HEADERS]
        target = f"{request.path}?{request.query}" if request.query else request.path
        passed.call = self.pool.send(self.engine, request.method, target, request.body, passed, headers)


class Door:
    """The connections of a host's relays that have not shown the credential yet: at most
    `unauthenticated` of them, each for at most `credential_within` seconds."""

    def __init__(self, *, unauthenticated: int, credential_within: float) -> None:
        self.unauthenticated, self.credential_within = unauthenticated, credential_within
        self.waiting: dict[RelayConnection, asyncio.TimerHandle] = {}  # oldest first
        self.peers: Counter[str] = Counter()
        self.closed = 0  # connections closed before they showed the credential (evicted or late)

    def enter(self, conn: RelayConnection) -> None:
        """A new connection, let in; the oldest of the peer holding the most closed if it is one too many."""
        while len(self.waiting) >= self.unauthenticated:
            most = max(self.peers.values())
            self._close(next(c for c in self.waiting if self.peers[c.peer] == most))
        self.peers[conn.peer] += 1
        self.waiting[conn] = asyncio.get_running_loop().call_later(self.credential_within, self._close, conn)

    def leave(self, conn: RelayConnection) -> None:
        """The connection showed the credential, or is gone."""
        timer = self.waiting.pop(conn, None)
        if timer is None:
            return
        timer.cancel()
        self.peers[conn.peer] -= 1
        if not self.peers[conn.peer]:
            del self.peers[conn.peer]

    def _close(self, conn: RelayConnection) -> None:
        self.leave(conn)
        self.closed += 1
        conn.close()


class RelayConnection(Connection):
    """A client connection of one relay, counted at the `door` until it shows the credential."""

    def __init__(self, relay: EngineRelay, door: Door, limits: Limits) -> None:
        super().__init__(relay.handle, self._admit, limits)
        self.relay, self.door, self.peer = relay, door, ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if not self.closed:
            self.peer = str((transport.get_extra_info("peername") or ("",))[0])
            self.door.enter(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.door.leave(self)
        super().connection_lost(exc)

    def _admit(self, request: Request) -> Answer | None:
        refusal = self.relay.admit(request)
        if refusal is None:
            self.door.leave(self)
        return refusal


class Relays:
    """A host's relays, each listening on (address, port), served from one loop thread."""

    def __init__(self, key: str, *, unauthenticated: int, credential_within: float) -> None:
        self.key = key
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(LoopErrors().report)
        self.pool = EnginePool()
        self.door = Door(unauthenticated=unauthenticated, credential_within=credential_within)
        self.servers: dict[tuple[str, int], asyncio.Server] = {}
        threading.Thread(target=self.loop.run_forever, name="engine-relays", daemon=True).start()

    def ensure(self, address: str, port: int, engine: str) -> None:
        """Relay `engine` on address:port, unless it already is."""
        if (address, port) not in self.servers:
            relay = EngineRelay(engine, self.key, self.pool)
            limits = Limits()  # one relay's connections share its cap and body budget, as a gateway's do
            listening = self.loop.create_server(lambda: RelayConnection(relay, self.door, limits), address, port)
            self.servers[(address, port)] = self._call(listening)

    def drop(self, address: str, port: int) -> None:
        server = self.servers.pop((address, port), None)
        if server is not None:
            self._call(_closed(server))

    def close(self) -> None:
        for address, port in list(self.servers):
            self.drop(address, port)
        self.loop.call_soon_threadsafe(self.loop.stop)

    def _call(self, step):
        return asyncio.run_coroutine_threadsafe(step, self.loop).result(10)


class LoopErrors:
    """The relays' loop's errors, logged at most once per `LOG_EVERY` seconds for each message
    (asyncio's own handler writes a traceback for each, which a full file table repeats without end)."""

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self.seen: Counter[str] = Counter()
        self.logged: dict[str, float] = {}

    def report(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", "unexpected error"))
        self.seen[message] += 1
        now = self.clock()
        if now - self.logged.get(message, -LOG_EVERY) < LOG_EVERY:
            return
        self.logged[message] = now
        log.error("relay_loop_error", message=message, count=self.seen.pop(message),
                  error=repr(context.get("exception"))[:200], every=LOG_EVERY)


async def _closed(server: asyncio.Server) -> None:
    server.close()
    await server.wait_closed()
