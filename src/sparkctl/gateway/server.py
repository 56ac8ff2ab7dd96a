"""The gateway's listening side: a small HTTP/1.1 server made for proxying streams.

Framing is llhttp's (through httptools), which refuses what a front proxy could read another
way: conflicting Content-Lengths, Transfer-Encodings other than chunked, loose chunk sizes,
control characters in header values. On top of it this server requires Host on HTTP/1.1,
allows one Host, and asks `admit` about each request as soon as its head is complete, so a
request without a valid API key is refused before any of its body is read.

A request is handed to its handler from the socket's own callback the moment its last byte
arrives, and a handler answers by writing to the connection directly, so a proxied request
reaches its engine, and each token its client, without waiting in the event loop's queue behind
the other streams (which is what a task per request costs a busy general-purpose server).
Handlers that must wait (a held alias, a full concurrency cap) start a task of their own.

Keep-alive and pipelining are supported: requests on one connection are answered in order. A
client that goes away, or stops reading, reaches the handler's exchange through `cancel`,
`pause` and `resume`. Connections are capped (`Limits`), and so are the bytes of request bodies
held at once across all of them.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import httptools

from sparkctl.gateway.http1 import chunk, response_head

MAX_BODY = 32 * 1024 * 1024
KEEP_ALIVE = 75.0  # seconds an idle client connection is kept open
PIPELINED = 16  # complete requests waiting behind the one being answered, before reading pauses
FINISH_GRACE = 1.0  # seconds an idle connection stays open once the server stops


@dataclass(slots=True)
class Request:
    method: str
    path: str  # without the query string
    headers: dict[str, str]  # names in lower case
    body: bytes
    keep_alive: bool = True  # whether the connection stays open after its answer


class Exchange(Protocol):
    """What a handler leaves behind while it answers: told when the client goes or stalls."""

    def cancel(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...


Handler = Callable[[Request, "Connection"], None]
Answer = Callable[["Connection"], None]  # writes one response
# Asked once a request's head is complete: an answer refuses it before its body is read.
Admit = Callable[[Request], Answer | None]


@dataclass
class Limits:
    """What all connections of one server share: how many may be open, and how many bytes of
    request bodies may be held at once. A refusal is counted, and `refused` reports it (the
    gateway logs it at most once per interval)."""

    connections: int = 4096
    body_bytes: int = 256 * 1024 * 1024
    held: int = 0
    refused: int = 0
    last_report: float = field(default=0.0)
    live: set[Connection] = field(default_factory=set)  # open connections
    finishing: bool = False  # a graceful stop began: connections close after their next answer

    @property
    def open(self) -> int:
        return len(self.live)

    def finish(self) -> None:
        """A graceful stop: every connection closes once the response it is giving is complete
        (an idle one at once), so a client's next request opens a new connection."""
        self.finishing = True
        for conn in list(self.live):
            conn.finish()

    def report_due(self, every: float = 10.0) -> int:
        """Refusals since the last report, when one is due (else 0)."""
        now = time.monotonic()
        if not self.refused or now - self.last_report < every:
            return 0
        count, self.refused, self.last_report = self.refused, 0, now
        return count


class Connection(asyncio.Protocol):
    """One client connection: requests parsed as bytes arrive and answered one at a time."""

    def __init__(self, handle: Handler, admit: Admit | None = None, limits: Limits | None = None) -> None:
        self.handle, self.admit, self.limits = handle, admit, limits or Limits()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.queue: deque[Request] = deque()  # complete requests waiting for their turn
        self.refusal: Answer | None = None  # the last answer on this connection, once the queue is done
        self.request: Request | None = None  # being answered
        self.exchange: Exchange | None = None  # the handler's, while it answers
        self.closed = self.paused = self.keep_alive = self.chunked = self.dispatching = False
        self.pending_head = b""  # a streamed response's head, sent with its first piece
        self.timer: asyncio.TimerHandle | None = None
        self.incoming: Request | None = None  # being parsed
        self.url = b""  # its target so far
        self.fields: list[tuple[str, str]] = []  # its header lines
        self.pieces: list[bytes] = []  # its body so far
        self.size = 0

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

    def finish(self) -> None:
        """Close after the next response: the one in progress, or, on an idle connection, the one
        to a request sent within `FINISH_GRACE` (a client that is about to reuse the connection
        then gets its answer instead of a reset); an idle connection closes after that."""
        self.keep_alive = False
        if self._idle_now():
            if self.timer is not None:
                self.timer.cancel()
            self.timer = asyncio.get_running_loop().call_later(FINISH_GRACE, self.close)

    def close(self) -> None:
        self.closed = True
        self._release()
        if self.transport is not None:
            self.transport.close()

    # --- asyncio's side -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.limits.open >= self.limits.connections:
            self.limits.refused += 1
            transport.write(response_head(503, [("Content-Length", "0"), ("Connection", "close")]))
            self.closed = True
            transport.close()
            return
        self.limits.live.add(self)
        self._idle()
        if self.limits.finishing:  # accepted just before the listener closed
            self.finish()

    def data_received(self, data: bytes) -> None:
        if self.closed or self.refusal is not None:
            return
        try:
            self.parser.feed_data(data)
        except _Refused:
            pass
        except httptools.HttpParserUpgrade:
            self._refuse(_text(400, "protocol upgrades are not supported\n"))
        except httptools.HttpParserError as e:
            if self.refusal is None:
                self._refuse(_text(400, f"malformed request: {e}\n"))

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

    # --- llhttp's callbacks, from inside feed_data ------------------------------------------------
    def on_message_begin(self) -> None:
        self.incoming, self.url, self.fields, self.pieces, self.size = Request("", "", {}, b""), b"", [], [], 0

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name.decode("latin-1").lower(), value.decode("latin-1").strip()))

    def on_headers_complete(self) -> None:
        request = self.incoming
        version, target = self.parser.get_http_version(), self.url.decode("latin-1")
        request.method, request.path = self.parser.get_method().decode("latin-1"), target.partition("?")[0]
        request.headers = dict(self.fields)
        names = [n for n, _ in self.fields]
        problem = _problem(version, target, request.headers, names)
        if problem:
            self._halt(_text(400, problem + "\n"))
        length = request.headers.get("content-length", "0")
        if int(length) > MAX_BODY:
            self._halt(_text(413, f"request body over {MAX_BODY >> 20} MiB\n"))
        refusal = self.admit(request) if self.admit is not None else None
        if refusal is not None:
            self._halt(refusal)
        request.keep_alive = self.parser.should_keep_alive()
        if request.headers.get("expect", "").lower() == "100-continue" and self._idle_now():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # the client waits for it to send the body

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        self.limits.held += len(body)
        self.pieces.append(body)
        if self.size > MAX_BODY:
            self._halt(_text(413, f"request body over {MAX_BODY >> 20} MiB\n"))
        if self.limits.held > self.limits.body_bytes:
            self.limits.refused += 1
            self._halt(_text(503, "the gateway holds too many request bodies at once; retry shortly\n",
                               [("Retry-After", "1")]))

    def on_message_complete(self) -> None:
        request, self.incoming = self.incoming, None
        request.body = b"".join(self.pieces)
        self._release()
        self.queue.append(request)
        if len(self.queue) > PIPELINED:
            self.transport.pause_reading()
        self._dispatch()

    # --- requests -------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        """Answer what is queued, in order; a loop, not recursion, since handlers often answer at once."""
        if self.dispatching:
            return
        self.dispatching = True
        try:
            while self.request is None and not self.closed:
                if self.queue:
                    if self.timer is not None:
                        self.timer.cancel()
                    self.request = self.queue.popleft()
                    self.keep_alive = self.request.keep_alive and not self.limits.finishing
                    self.handle(self.request, self)
                elif self.refusal is not None:
                    self.keep_alive, self.request = False, Request("", "", {}, b"")
                    self.refusal(self)
                else:
                    break
        finally:
            self.dispatching = False

    def _refuse(self, answer: Answer) -> None:
        """Stop reading this connection: `answer` is its last response, after those queued."""
        self.refusal = answer
        self._release()
        if self.transport is not None:
            self.transport.pause_reading()
        self._dispatch()

    def _halt(self, answer: Answer) -> None:
        """`_refuse` from inside a parser callback: parsing stops here."""
        self._refuse(answer)
        raise _Refused

    def _done(self) -> None:
        """The response has been written: on to the next request, or close."""
        self.request, self.exchange, self.chunked = None, None, False
        if not self.keep_alive:
            self.close()
            return
        if len(self.queue) <= PIPELINED and self.refusal is None:
            self.transport.resume_reading()
        self._idle()
        self._dispatch()

    def _idle_now(self) -> bool:
        return self.request is None and not self.queue

    def _release(self) -> None:
        """The bytes of a body being read no longer count against the shared budget."""
        self.limits.held -= self.size
        self.size = 0

    def _gone(self) -> None:
        self.limits.live.discard(self)
        if self.closed and self.exchange is None:
            return
        self.closed = True
        self._release()
        if self.timer is not None:
            self.timer.cancel()
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.cancel()
        if self.transport is not None:
            self.transport.close()

    def _idle(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = asyncio.get_running_loop().call_later(KEEP_ALIVE, self.close)

    def _connection(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return headers if self.keep_alive else [*headers, ("Connection", "close")]


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a connection that has been refused."""


def _problem(version: str, target: str, headers: dict[str, str], names: list[str]) -> str:
    """What is wrong with a request head that llhttp lets through, or ""."""
    if version not in ("1.0", "1.1") or not target.startswith("/"):
        return f"request line: HTTP/{version} {target[:60]!r} (origin-form HTTP/1.x only)"
    if names.count("host") > 1 or (version == "1.1" and "host" not in headers):
        return "an HTTP/1.1 request needs exactly one Host header"
    te = headers.get("transfer-encoding")
    if te is not None and (te.lower() != "chunked" or names.count("transfer-encoding") > 1):
        return f"Transfer-Encoding {te[:40]!r}: only chunked is supported"
    return ""


def _text(status: int, text: str, headers: Sequence[tuple[str, str]] = ()) -> Answer:
    return lambda conn: conn.reply(status, text.encode(), "text/plain", headers)


async def serve(handle: Handler, host: str, port: int, *, admit: Admit | None = None,
                limits: Limits | None = None, sock: socket.socket | None = None) -> asyncio.Server:
    """Listen on host:port (or on `sock`, a listening socket handed over), handing each request to
    `handle` (after `admit`, if given)."""
    shared = limits or Limits()
    loop = asyncio.get_running_loop()
    if sock is not None:
        return await loop.create_server(lambda: Connection(handle, admit, shared), sock=sock)
    return await loop.create_server(lambda: Connection(handle, admit, shared), host, port)
