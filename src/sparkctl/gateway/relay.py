"""A fleet host's engine relays: how the head's gateway reaches an engine placed on another Spark,
without that engine ever listening beyond its host's loopback.

A placed engine binds 127.0.0.1 like any other, so vLLM's dev endpoints (`/sleep`, `/wake_up`,
`/collective_rpc`, `/reset_prefix_cache`: its `--api-key` guards only `/v1`) are never reachable
from off the host. The host's agent (`agent.py`) serves each one on the host's serving address,
same port, through an `EngineRelay`: a request must carry the fleet's relay credential
(`Authorization: Bearer <key>`, derived from the fleet's Ray token, which every host holds 0600)
and ask for one of the few routes the head uses; anything else is refused before its body is
read. The credential is dropped before the request goes on to the engine. An engine that does not
answer closes the head's connection unanswered, as the engine itself would have, so the head's
gateway moves the request to another replica.

`Relays` runs a host's relays on one event loop thread of the agent's process.
"""

from __future__ import annotations

import asyncio
import hmac
import threading

from sparkctl.gateway.passthrough import Passed
from sparkctl.gateway.pool import EnginePool
from sparkctl.gateway.request import Answer, Request
from sparkctl.gateway.server import Connection, error, serve

# What the head asks of a placed engine: its gateway's forwards, the fleet watch's probes (health,
# and from the metrics whether it sleeps), the dashboard's counters. Nothing else of vLLM's API is passed.
ROUTES = {("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/health"),
          ("GET", "/metrics")}
PASSED_HEADERS = ("content-type", "accept")


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


class Relays:
    """A host's relays, each listening on (address, port), served from one loop thread."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.loop = asyncio.new_event_loop()
        self.pool = EnginePool()
        self.servers: dict[tuple[str, int], asyncio.Server] = {}
        threading.Thread(target=self.loop.run_forever, name="engine-relays", daemon=True).start()

    def ensure(self, address: str, port: int, engine: str) -> None:
        """Relay `engine` on address:port, unless it already is."""
        if (address, port) not in self.servers:
            relay = EngineRelay(engine, self.key, self.pool)
            self.servers[(address, port)] = self._call(serve(relay.handle, address, port, admit=relay.admit))

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


async def _closed(server: asyncio.Server) -> None:
    server.close()
    await server.wait_closed()
