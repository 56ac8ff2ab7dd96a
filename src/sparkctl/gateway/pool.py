"""The gateway's pool of keep-alive connections to the engines, per engine address. A request
goes out through `EnginePool.send` (or `post`, for JSON), written in one `write` to an idle
connection straight from the caller, or to a fresh one (`upstream.py` makes, reads and gives back
the connections; a `Call` is the request's handle). A connection idle for `idle_timeout` is closed
rather than reused, before the engine's own keep-alive timeout could close it under a request
(uvicorn's is 5 s). Built by the `Gateway` (`proxy.py`) and by a fleet host's relays (`relay.py`);
the dashboard (`ui.py`) reaches the daemon's API through the gateway's pool.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

from sparkctl.gateway.upstream import Address, Call, EngineConnection, Sink


class EnginePool:
    """Pooled connections per engine address (`http://host:port`, or `unix:/path` for the daemon's
    own API, which the dashboard reaches through the gateway)."""

    def __init__(self, *, connect_timeout: float = 5.0, idle_timeout: float = 4.0) -> None:
        self.connect_timeout, self.idle_timeout = connect_timeout, idle_timeout
        self.idle: dict[Address, list[EngineConnection]] = {}
        self.addresses: dict[str, Address] = {}

    def post(self, url: str, path: str, body: bytes, sink: Sink, headers: Sequence[tuple[str, str]] = (), *,
             stall: float | None = None, first_byte: float | None = None) -> Call:
        """Send `body` as JSON to `url` + `path`; the answer goes to `sink`. Needs a running loop.
        `stall`: fail the call once the engine has sent nothing for that many seconds; `first_byte`:
        once it has sent nothing of its answer for that many (default: `stall`)."""
        return self.send(url, "POST", path, body, sink, [("Content-Type", "application/json"), *headers], stall=stall,
                         first_byte=first_byte)

    def send(self, url: str, method: str, target: str, body: bytes, sink: Sink,
             headers: Sequence[tuple[str, str]] = (), *, stall: float | None = None,
             first_byte: float | None = None) -> Call:
        """Any request to `url` (`target`: path and query); the answer goes to `sink`."""
        address = self._address(url)
        host = "localhost" if isinstance(address, str) else f"{address[0]}:{address[1]}"
        head = [f"{method} {target} HTTP/1.1", f"Host: {host}", *(f"{k}: {v}" for k, v in headers),
                f"Content-Length: {len(body)}"]
        message = ("\r\n".join(head) + "\r\n\r\n").encode() + body
        call = Call(self, address, message, sink, stall=stall, first_byte=first_byte)
        conn = self._take(address)
        if conn is not None:
            conn.send(call)
        else:
            call.task = asyncio.ensure_future(call.connect())
        return call

    def close(self) -> None:
        for conns in self.idle.values():
            for conn in conns:
                conn.close()
        self.idle.clear()

    def _address(self, url: str) -> Address:
        address = self.addresses.get(url)
        if address is None:
            parts = urlsplit(url)
            address = self.addresses[url] = parts.path if parts.scheme == "unix" else (parts.hostname or "127.0.0.1",
                                                                                         parts.port or 80)
        return address

    def _take(self, address: Address) -> EngineConnection | None:
        conns = self.idle.get(address)
        horizon = time.monotonic() - self.idle_timeout
        while conns:
            conn = conns.pop()
            if conn.idle_since > horizon and not conn.closed:
                return conn
            conn.close()
        return None

    def give_back(self, conn: EngineConnection) -> None:
        conn.idle_since = time.monotonic()
        self.idle.setdefault(conn.address, []).append(conn)
