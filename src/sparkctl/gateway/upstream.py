"""Lean keep-alive HTTP/1.1 from the gateway to the engines.

The gateway only ever POSTs a JSON body to an engine on loopback and passes the answer on as it
arrives, so it needs far less than a general HTTP client, and it works without a single hop
through the event loop's queue: a request is written to a pooled connection in one `write`
straight from the caller, and each piece of the answer is handed to the caller's `Sink` from the
socket's own callback, de-chunked, in the pieces the socket delivered. That is what keeps the
time the gateway adds to a first token near zero even when it is busy with many streams. The
answer is framed by llhttp (httptools' response parser), as the client's request is.

A connection goes back to the pool (`pool.py`, which sends every request) only after a response
that ended cleanly; any other end closes it, which is also how a client's disconnect reaches the
engine. A request that finds its reused connection closed under it, before any byte of the
answer, is sent again once on a fresh one. Flow control is the caller's: `Call.pause` stops
reading from the engine.

Nothing waits on an engine for good: connecting is bounded (`connect_timeout`), and a call given a
`stall` bound (the gateway's streams) fails once its engine has sent nothing for that long, from
the request's write or its last byte, not counting time its caller kept reading paused: a
stream from an engine on a host whose link is cut would otherwise hang until TCP gives up. A
`first_byte` bound alone (the gateway's whole answers, which come at once when they are done)
bounds only the wait for the answer's first byte.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Protocol

import httptools

if TYPE_CHECKING:
    from sparkctl.gateway.pool import EnginePool


class UpstreamError(Exception):
    """The engine could not be reached or broke off its answer. `unanswered`: the engine served no
    part of the request (refused, reset or closed before answering), so it may go to another
    replica. `stalled`: the engine sent nothing for the call's `stall` (or `first_byte`) bound."""

    def __init__(self, message: str, *, unanswered: bool = False, stalled: bool = False) -> None:
        super().__init__(message)
        self.unanswered, self.stalled = unanswered, stalled


class Sink(Protocol):
    """Where an answer goes, as it arrives."""

    def head(self, status: int, headers: list[tuple[str, str]], length: int | None) -> None:
        """The status and headers; `length` is the body's, None when it is not known up front."""

    def body(self, piece: bytes, last: bool) -> None:
        """The next piece of the body (maybe empty); `last` once it is complete."""

    def failed(self, error: UpstreamError) -> None:
        """No answer, or the answer broke off; nothing more follows."""


Address = tuple[str, int] | str  # host and port, or a unix socket's path


class Call:
    """One request to an engine, from sending until its answer ends, fails or is cancelled."""

    def __init__(self, pool: EnginePool, address: Address, message: bytes, sink: Sink, *,
                 stall: float | None = None, first_byte: float | None = None) -> None:
        self.pool, self.address, self.message, self.sink = pool, address, message, sink
        self.stall = stall  # s the engine may send nothing before the call fails; None: unbounded
        self.first_byte = stall if first_byte is None else first_byte  # s until the answer's first byte
        self.conn: EngineConnection | None = None
        self.task: asyncio.Task[None] | None = None  # making a fresh connection, when one was needed
        self.paused = self.retried = False

    def cancel(self) -> None:
        """The caller lost interest: the engine's connection is closed, so the engine stops."""
        if self.task is not None:
            self.task.cancel()
        if self.conn is not None:
            self.conn.call = None
            self.conn.close()

    def pause(self) -> None:
        self.paused = True
        if self.conn is not None:
            self.conn.reading(False)

    def resume(self) -> None:
        self.paused = False
        if self.conn is not None:
            self.conn.reading(True)

    async def connect(self) -> None:
        loop, address = asyncio.get_running_loop(), self.address
        made = lambda: EngineConnection(self.pool, address)  # noqa: E731
        try:
            _, conn = await asyncio.wait_for(loop.create_unix_connection(made, address) if isinstance(address, str)
                                             else loop.create_connection(made, *address), self.pool.connect_timeout)
        except (OSError, TimeoutError) as e:
            where = address if isinstance(address, str) else f"{address[0]}:{address[1]}"
            self.sink.failed(UpstreamError(f"cannot connect to {where} ({type(e).__name__})", unanswered=True))
            return
        conn.send(self)


class Relay:
    """A client connection's exchange that passes its flow control on to the upstream call."""

    call: Call | None = None

    def pause(self) -> None:
        if self.call is not None:
            self.call.pause()

    def resume(self) -> None:
        if self.call is not None:
            self.call.resume()


class EngineConnection(asyncio.Protocol):
    """One keep-alive connection; parses one response at a time and hands it to its call's sink."""

    def __init__(self, pool: EnginePool, address: Address) -> None:
        self.pool, self.address = pool, address
        self.transport: asyncio.Transport | None = None
        self.call: Call | None = None
        self.closed = self.paused = False
        self.uses = 0
        self.idle_since = 0.0
        self.heard = 0.0  # when the engine last sent a byte, or reading last resumed (monotonic)
        self.watch: asyncio.TimerHandle | None = None  # the stall check of a call with a bound

    def send(self, call: Call) -> None:
        if self.closed:  # closed while it was being made
            call.sink.failed(UpstreamError("the engine closed the connection", unanswered=True))
            return
        self.call, call.conn = call, self
        self.uses += 1
        self.parser = httptools.HttpResponseParser(self)
        self.answered = self.headed = self.ended = self.framed = False
        self.headers: list[tuple[str, str]] = []
        self.pieces: list[bytes] = []  # the body's bytes of one `data_received`
        self.reusable = True
        self.reading(not call.paused)
        assert self.transport is not None
        self.transport.write(call.message)
        self._unwatch()
        if call.first_byte is not None:
            self.heard = time.monotonic()
            self.watch = asyncio.get_running_loop().call_later(call.first_byte, self._check_stall)

    def reading(self, on: bool) -> None:
        if self.transport is not None and not self.closed and on == self.paused:
            self.paused = not on
            (self.transport.resume_reading if on else self.transport.pause_reading)()
            if on:
                self.heard = time.monotonic()  # a paused read is the caller's wait, not the engine's silence

    def close(self) -> None:
        self.closed = True
        self._unwatch()
        if self.transport is not None:
            self.transport.close()

    # --- asyncio's side -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def eof_received(self) -> None:
        self.closed = True  # no new request on it; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._unwatch()
        call, self.call = self.call, None
        if call is None:
            return
        if not self.answered and self.uses > 1 and not call.retried:
            call.retried, call.conn = True, None  # the engine closed the idle connection as we wrote to it
            call.task = asyncio.ensure_future(call.connect())
        elif not self.headed:
            call.sink.failed(UpstreamError("the engine closed the connection before answering",
                                           unanswered=not self.answered))
        elif not self.framed:
            call.sink.body(b"", True)  # a body framed by the connection's end
        else:
            call.sink.failed(UpstreamError("the engine closed the connection mid-response"))

    def data_received(self, data: bytes) -> None:
        call = self.call
        if call is None:  # bytes no request asked for
            self.close()
            return
        self.answered, self.heard = True, time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            if not self.ended:
                self.call = None
                self.close()
                call.sink.failed(UpstreamError(f"bad response from the engine: {e}"))
                return
            self.reusable = False  # bytes after the answer: the connection is not trusted again
        if self.call is None:  # the sink cancelled the call while taking the head
            return
        piece, self.pieces = b"".join(self.pieces), []
        if self.ended:
            self.call = None
            self._unwatch()
            if self.reusable:
                self.pool.give_back(self)
            else:
                self.close()
        if self.headed:
            call.sink.body(piece, self.ended)

    # --- httptools' callbacks: one answer, after any interim (1xx) ones ----------------------------
    def on_message_begin(self) -> None:
        self.headers = []
        if self.ended:  # the engine sent more than the answer
            self.reusable = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200 or self.ended or self.call is None:
            return
        named = {name.lower(): value for name, value in self.headers}
        length = 0 if status in (204, 304) else named.get("content-length")
        self.framed = length is not None or "transfer-encoding" in named
        self.reusable = self.reusable and self.framed and self.parser.should_keep_alive()
        self.headed = True
        self.call.sink.head(status, self.headers, None if length is None else int(length))

    def on_body(self, body: bytes) -> None:
        if not self.ended:
            self.pieces.append(body)

    def on_message_complete(self) -> None:
        if self.headed:
            self.ended = True

    def _check_stall(self) -> None:
        """The call's bound: fail it once its engine has been silent that long (while reading):
        `first_byte` until the answer's first byte, `stall` after it (none: no bound)."""
        call, self.watch = self.call, None
        bound = None if call is None else call.stall if self.answered else call.first_byte
        if bound is None:
            return
        quiet = time.monotonic() - self.heard
        if self.paused or quiet < bound:
            self.watch = asyncio.get_running_loop().call_later(bound - (0 if self.paused else quiet),
                                                               self._check_stall)
            return
        self.call = None
        self.close()
        call.sink.failed(UpstreamError(f"the engine sent nothing for {bound:g} s", stalled=True,
                                       unanswered=not self.answered))

    def _unwatch(self) -> None:
        if self.watch is not None:
            self.watch.cancel()
            self.watch = None
