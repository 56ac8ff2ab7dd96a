"""Lean keep-alive HTTP/1.1 from the gateway to the engines.

The gateway only ever POSTs a JSON body to an engine on loopback and passes the answer on as it
arrives, so it needs far less than a general HTTP client, and it works without a single hop
through the event loop's queue: a request is written to a pooled connection in one `write`
straight from the caller, and each piece of the answer is handed to the caller's `Sink` from the
socket's own callback, de-chunked, in the pieces the socket delivered. That is what keeps the
time the gateway adds to a first token near zero even when it is busy with many streams.

A connection goes back to the pool (`pool.py`, which sends every request) only after a response
that ended cleanly; any other end closes it, which is also how a client's disconnect reaches the
engine. A request that finds its reused connection closed under it, before any byte of the
answer, is sent again once on a fresh one. Flow control is the caller's: `Call.pause` stops
reading from the engine.

Nothing waits on an engine for good: connecting is bounded (`connect_timeout`), and a call given a
`stall` bound (the gateway's streams) fails once its engine has sent nothing for that long, from
the request's write or its last byte, not counting time its caller kept reading paused: a
stream from an engine on a host whose link is cut would otherwise hang until TCP gives up.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Protocol

from sparkctl.gateway.http1 import Dechunker, Malformed, fields, split_head

if TYPE_CHECKING:
    from sparkctl.gateway.pool import EnginePool


class UpstreamError(Exception):
    """The engine could not be reached or broke off its answer. `unanswered`: the engine served no
    part of the request (refused, reset or closed before answering), so it may go to another
    replica. `stalled`: the engine sent nothing for the call's `stall` bound."""

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
                 stall: float | None = None) -> None:
        self.pool, self.address, self.message, self.sink = pool, address, message, sink
        self.stall = stall  # s the engine may send nothing before the call fails; None: unbounded
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
        self.buffer = b""
        self.heard = 0.0  # when the engine last sent a byte, or reading last resumed (monotonic)
        self.watch: asyncio.TimerHandle | None = None  # the stall check of a call with a bound

    def send(self, call: Call) -> None:
        if self.closed:  # closed while it was being made
            call.sink.failed(UpstreamError("the engine closed the connection", unanswered=True))
            return
        self.call, call.conn = call, self
        self.uses += 1
        self.buffer, self.answered, self.headed, self.ended = b"", False, False, False
        self.length: int | None = None  # bytes of body left (Content-Length framing)
        self.dechunker: Dechunker | None = None
        self.reusable = True
        self.reading(not call.paused)
        assert self.transport is not None
        self.transport.write(call.message)
        self._unwatch()
        if call.stall is not None:
            self.heard = time.monotonic()
            self.watch = asyncio.get_running_loop().call_later(call.stall, self._check_stall)

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
        elif self.length is None and self.dechunker is None:
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
            if not self.headed:
                data = self._head(self.buffer + data, call)
                if data is None or self.call is None:
                    return
            piece = self._body(data)
        except Malformed as e:
            self.call = None
            self.close()
            call.sink.failed(UpstreamError(f"bad response from the engine: {e}"))
            return
        if self.ended:
            self.call = None
            self._unwatch()
            if self.reusable and not self.buffer:
                self.pool.give_back(self)
            else:
                self.close()
        call.sink.body(piece, self.ended)

    def _check_stall(self) -> None:
        """The call's bound: fail it once its engine has been silent that long (while reading)."""
        call, self.watch = self.call, None
        if call is None or call.stall is None:
            return
        quiet = time.monotonic() - self.heard
        if self.paused or quiet < call.stall:
            self.watch = asyncio.get_running_loop().call_later(call.stall - (0 if self.paused else quiet),
                                                               self._check_stall)
            return
        self.call = None
        self.close()
        call.sink.failed(UpstreamError(f"the engine sent nothing for {call.stall:g} s", stalled=True,
                                       unanswered=not self.answered))

    def _unwatch(self) -> None:
        if self.watch is not None:
            self.watch.cancel()
            self.watch = None

    def _head(self, data: bytes, call: Call) -> bytes | None:
        """Parses the status line and headers; the bytes after them, None while incomplete."""
        while True:
            split = split_head(data)
            if split is None:
                self.buffer = data
                return None
            lines, start = split
            data = data[start:]
            version, _, rest = lines[0].partition(" ")
            if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
                raise Malformed(f"status line {lines[0][:40]!r}")
            status = int(rest[:3])
            if not 100 <= status < 200:  # else an interim response: the real one follows
                break
        headers = fields(lines[1:])
        named = {name.lower(): value.lower() for name, value in headers}
        self.reusable = version == "HTTP/1.1" and "close" not in named.get("connection", "")
        if status in (204, 304):
            self.length = 0
        elif "chunked" in named.get("transfer-encoding", ""):
            self.dechunker = Dechunker()
        elif "content-length" in named:
            if not named["content-length"].isdigit():
                raise Malformed(f"Content-Length {named['content-length'][:20]!r}")
            self.length = int(named["content-length"])
        else:
            self.reusable = False  # the body runs until the connection closes
        self.headed, self.buffer = True, b""
        call.sink.head(status, headers, self.length)
        return data

    def _body(self, data: bytes) -> bytes:
        if self.length is not None:
            piece = data[:self.length]
            self.length -= len(piece)
            self.ended, self.buffer = self.length == 0, data[len(piece):]
            return piece
        if self.dechunker is not None:
            piece = self.dechunker.feed(data)
            self.ended, self.buffer = self.dechunker.ended, self.dechunker.rest
            return piece
        return data
