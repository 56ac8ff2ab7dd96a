"""The gateway's listening side: a small HTTP/1.1 server made for proxying streams.

A request is handed to its handler from the socket's own callback the moment its last byte
arrives, and a handler answers by writing to the connection directly, so a proxied request
reaches its engine, and each token its client, without waiting in the event loop's queue behind
the other streams (which is what a task per request costs a busy general-purpose server).
Handlers that must wait (a held alias, a full concurrency cap) start a task of their own.

Keep-alive and pipelining are supported: requests on one connection are answered in order.
Bodies come with Content-Length or chunked. A client that goes away, or stops reading, reaches
the handler's exchange through `cancel`, `pause` and `resume`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sparkctl.gateway.http1 import Dechunker, Malformed, chunk, fields, response_head, split_head

MAX_BODY = 32 * 1024 * 1024
KEEP_ALIVE = 75.0  # seconds an idle client connection is kept open


@dataclass(slots=True)
class Request:
    method: str
    path: str  # without the query string
    headers: dict[str, str]  # names in lower case
    body: bytes


class Exchange(Protocol):
    """What a handler leaves behind while it answers: told when the client goes or stalls."""

    def cancel(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...


Handler = Callable[[Request, "Connection"], None]


class Connection(asyncio.Protocol):
    """One client connection: requests parsed as bytes arrive and answered one at a time."""

    def __init__(self, handle: Handler) -> None:
        self.handle = handle
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.wanted = 0  # bytes the buffer must hold before the request in it can be complete
        self.continued = False  # sent "100 Continue" for the request in the buffer
        self.request: Request | None = None  # being answered
        self.exchange: Exchange | None = None  # the handler's, while it answers
        self.closed = self.paused = self.keep_alive = self.chunked = False
        self.pending_head = b""  # a streamed response's head, sent with its first piece
        self.timer: asyncio.TimerHandle | None = None

    # --- the handler's side --------------------------------------------------------------------
    def reply(self, status: int, body: bytes, content_type: str, headers: Sequence[tuple[str, str]] = ()) -> None:
        """A whole response."""
        if self.closed:
            return
        head = [("Content-Type", content_type), ("Content-Length", str(len(body))), *headers]
        self.transport.write(response_head(status, self._connection(head)) + body)
        self._done()

    def reply_json(self, status: int, data: object, headers: Sequence[tuple[str, str]] = ()) -> None:
        self.reply(status, json.dumps(data).encode(), "application/json", headers)

    def start(self, status: int, headers: list[tuple[str, str]], length: int | None) -> None:
        """A streamed response: its body follows through `send`, chunked unless `length` is given."""
        self.chunked = length is None
        framing = ("Transfer-Encoding", "chunked") if self.chunked else ("Content-Length", str(length))
        self.pending_head = response_head(status, self._connection([*headers, framing]))

    def send(self, piece: bytes, last: bool) -> None:
        """The next piece of a streamed body; `last` ends the response."""
        if self.closed:
            return
        data = chunk(piece, last) if self.chunked else piece
        if self.pending_head:
            data, self.pending_head = self.pending_head + data, b""
        if data:
            self.transport.write(data)
        if last:
            self._done()

    def abort(self) -> None:
        """Close without ending the response, so the client knows what it got is incomplete."""
        self.exchange = None
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # --- asyncio's side -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._idle()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.request is None and len(self.buffer) >= self.wanted:
            self._next()
        elif len(self.buffer) > MAX_BODY:  # pipelined far ahead of the answers
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self._gone()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone()

    def pause_writing(self) -> None:
        self.paused = True
        if self.exchange is not None:
            self.exchange.pause()

    def resume_writing(self) -> None:
        self.paused = False
        if self.exchange is not None:
            self.exchange.resume()

    # --- requests -------------------------------------------------------------------------------
    def _next(self) -> None:
        """Hand on the next complete request in the buffer, if there is one."""
        try:
            request = self._parse()
        except Malformed as e:
            self._refuse(400, f"{e}\n")
            return
        except _TooLarge:
            self._refuse(413, f"request body over {MAX_BODY >> 20} MiB\n")
            return
        if request is None:
            return
        if self.timer is not None:
            self.timer.cancel()
        self.request = request
        self.handle(request, self)

    def _parse(self) -> Request | None:
        split = split_head(self.buffer)
        if split is None:
            return None
        lines, start = split
        method, target, version = (lines[0].split(" ") + ["", ""])[:3]
        if not version.startswith("HTTP/1.") or not target.startswith("/"):
            raise Malformed(f"request line {lines[0][:60]!r}")
        headers = {name.lower(): value for name, value in fields(lines[1:])}
        if "chunked" in headers.get("transfer-encoding", "").lower():
            if "content-length" in headers:
                raise Malformed("both Content-Length and Transfer-Encoding")
            dechunker = Dechunker()
            body = dechunker.feed(bytes(self.buffer[start:]))
            end = len(self.buffer) - len(dechunker.rest)
            complete = dechunker.ended
        else:
            length = headers.get("content-length", "0")
            if not length.isdigit():
                raise Malformed(f"Content-Length {length[:20]!r}")
            end = start + int(length)
            complete = len(self.buffer) >= end
            body = bytes(self.buffer[start:end]) if complete else b""
        if end - start > MAX_BODY:
            raise _TooLarge
        if not complete:
            self.wanted = end if "content-length" in headers else len(self.buffer) + 1
            if headers.get("expect", "").lower() == "100-continue" and not self.continued:
                self.continued = True  # the client waits for this before it sends the body
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return None
        del self.buffer[:end]
        self.wanted = 0
        connection = headers.get("connection", "").lower()
        self.keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
        return Request(method, target.partition("?")[0], headers, body)

    def _refuse(self, status: int, why: str) -> None:
        self.keep_alive = False
        self.reply(status, why.encode(), "text/plain")

    def _done(self) -> None:
        """The response has been written: on to the next request, or close."""
        self.request, self.exchange, self.chunked, self.continued = None, None, False, False
        if not self.keep_alive:
            self.close()
            return
        self.transport.resume_reading()
        self._idle()
        if self.buffer:
            self._next()

    def _gone(self) -> None:
        if self.closed and self.exchange is None:
            return
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.cancel()
        if self.transport is not None:
            self.transport.close()

    def _idle(self) -> None:
        self.timer = asyncio.get_running_loop().call_later(KEEP_ALIVE, self.close)

    def _connection(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return headers if self.keep_alive else [*headers, ("Connection", "close")]


class _TooLarge(Exception):
    pass


async def serve(handle: Handler, host: str, port: int) -> asyncio.Server:
    """Listen on host:port, handing each request to `handle`."""
    return await asyncio.get_running_loop().create_server(lambda: Connection(handle), host, port)
