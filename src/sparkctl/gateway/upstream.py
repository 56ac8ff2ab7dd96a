"""Lean keep-alive HTTP/1.1 from the gateway to the engines.

The gateway only ever POSTs a JSON body to an engine on loopback and passes the answer back as
it arrives, so it needs far less than a general HTTP client: a request is written to a pooled
connection in one `write`, without yielding to the event loop first (a burst of requests goes
out in the order it came in), and the response body is handed on in the pieces the socket
delivered, de-chunked. That is what keeps the time the gateway adds to a first token near zero.

A connection goes back to the pool only after a response that ended cleanly; any other end
closes it, which is also how a client's disconnect reaches the engine. Idle connections are
dropped before the engine's own keep-alive timeout could (uvicorn's is 5 s), and a request that
finds its reused connection closed under it, before any byte of the answer, is sent again once
on a fresh one.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from urllib.parse import urlsplit

PAUSE_ABOVE = 1 << 20  # bytes buffered for a slow client before the engine's socket is paused
RESUME_BELOW = 1 << 18
MAX_HEAD = 64 * 1024
_SIZE, _DATA_END, _TRAILER = -1, 0, -2  # what the next line of a chunked body is, when not chunk data


class UpstreamError(Exception):
    """The engine could not be reached or broke off its answer."""


class Reply:
    """One response: status and headers, then the body piece by piece (`async for`)."""

    def __init__(self, conn: _Connection, status: int, headers: list[tuple[str, str]]) -> None:
        self.conn, self.status, self.headers = conn, status, headers

    @property
    def finished(self) -> bool:
        """The whole body has been read: the piece just returned was the last."""
        return self.conn.ended and not self.conn.pieces

    def __aiter__(self) -> Reply:
        return self

    async def __anext__(self) -> bytes:
        piece = await self.conn.read()
        if not piece:
            raise StopAsyncIteration
        return piece

    async def __aenter__(self) -> Reply:
        return self

    async def __aexit__(self, *_: object) -> None:
        self.conn.finish()


class Upstreams:
    """Pooled connections per engine address."""

    def __init__(self, *, connect_timeout: float = 5.0, idle_timeout: float = 4.0) -> None:
        self.connect_timeout, self.idle_timeout = connect_timeout, idle_timeout
        self.idle: dict[tuple[str, int], list[_Connection]] = {}
        self.addresses: dict[str, tuple[str, int]] = {}

    async def post(self, url: str, path: str, body: bytes) -> Reply:
        """Send `body` as JSON to `url` + `path`; returns once the response head has arrived."""
        address = self._address(url)
        message = (f"POST {path} HTTP/1.1\r\nHost: {address[0]}:{address[1]}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        conn = self._take(address)
        if conn is not None:
            try:
                return await conn.exchange(message)
            except _Unanswered:
                pass  # the engine closed the idle connection as we wrote to it: once more, fresh
        conn = await self._connect(address)
        return await conn.exchange(message)

    def close(self) -> None:
        for conns in self.idle.values():
            for conn in conns:
                conn.close()
        self.idle.clear()

    def _address(self, url: str) -> tuple[str, int]:
        address = self.addresses.get(url)
        if address is None:
            parts = urlsplit(url)
            address = self.addresses[url] = (parts.hostname or "127.0.0.1", parts.port or 80)
        return address

    def _take(self, address: tuple[str, int]) -> _Connection | None:
        conns = self.idle.get(address)
        horizon = time.monotonic() - self.idle_timeout
        while conns:
            conn = conns.pop()
            if conn.idle_since > horizon and not conn.closed:
                return conn
            conn.close()
        return None

    def _give_back(self, conn: _Connection) -> None:
        conn.idle_since = time.monotonic()
        self.idle.setdefault(conn.address, []).append(conn)

    async def _connect(self, address: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(self, address), *address), self.connect_timeout)
        except (OSError, TimeoutError) as e:
            raise UpstreamError(f"cannot connect to {address[0]}:{address[1]} ({type(e).__name__})") from None
        return conn


class _Unanswered(UpstreamError):
    """The connection ended before any byte of the response: the request may be sent again."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; parses one response at a time."""

    def __init__(self, pool: Upstreams, address: tuple[str, int]) -> None:
        self.pool, self.address = pool, address
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.buffer = b""  # received, not yet parsed
        self.head: asyncio.Future[Reply] | None = None
        self.answered = False  # a byte of the response arrived
        self.pieces: deque[bytes] = deque()
        self.buffered = 0
        self.waiter: asyncio.Future[None] | None = None
        self.ended = False  # the body is complete
        self.failure: str | None = None
        self.reusable = True
        self.length: int | None = None  # bytes of body left (Content-Length framing)
        self.chunked = False
        self.chunk_left = _SIZE  # > 0: bytes left of a chunk's data; else what the next line is

    # --- the gateway's side -------------------------------------------------------------------
    async def exchange(self, message: bytes) -> Reply:
        if self.closed:
            raise _Unanswered("the engine closed the connection")
        self._reset()
        self.head = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(message)
        try:
            return await self.head
        except BaseException:
            self.close()
            raise

    async def read(self) -> bytes:
        """The next piece of the body; b"" once it is complete."""
        while not self.pieces:
            if self.ended:
                return b""
            if self.failure is not None:
                raise UpstreamError(self.failure)
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        piece = self.pieces.popleft()
        self.buffered -= len(piece)
        if self.buffered < RESUME_BELOW and self.transport is not None and not self.closed:
            self.transport.resume_reading()
        return piece

    def finish(self) -> None:
        """After a response: back to the pool if it ended cleanly, else closed."""
        if self.ended and self.reusable and not self.pieces and not self.buffer and not self.closed:
            self.pool._give_back(self)
        else:
            self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # --- asyncio's side -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.head is None or self.ended or self.failure is not None:
            return
        if not self.head.done():
            self.head.set_exception(_Unanswered("the engine closed the connection before answering")
                                    if not self.answered else UpstreamError("the engine closed the connection"))
        elif self.length is None and not self.chunked:
            self.ended = True  # a body framed by the connection's end
        else:
            self.failure = "the engine closed the connection mid-response"
        self._wake()

    def eof_received(self) -> None:
        self.closed = True  # no new request on it; connection_lost follows

    def data_received(self, data: bytes) -> None:
        if self.head is None or self.ended:  # bytes no request asked for
            self.close()
            return
        self.answered = True
        self.buffer = self.buffer + data if self.buffer else data
        try:
            if not self.head.done() and not self._parse_head():
                return
            self._parse_body()
        except ValueError as e:
            self._fail(f"bad response from the engine: {e}")

    def _fail(self, message: str) -> None:
        if self.head is not None and not self.head.done():
            self.head.set_exception(UpstreamError(message))
        self.failure = message
        self.close()
        self._wake()

    def _parse_head(self) -> bool:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD:
                raise ValueError("response head too large")
            return False
        lines = self.buffer[:end].decode("latin-1").split("\r\n")
        self.buffer = self.buffer[end + 4:]
        version, _, rest = lines[0].partition(" ")
        status = int(rest[:3])
        if 100 <= status < 200:  # an interim response: the real one follows
            return self._parse_head()
        headers = []
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise ValueError(f"malformed header line {line[:40]!r}")
            headers.append((name.strip(), value.strip()))
        fields = {name.lower(): value.lower() for name, value in headers}
        self.reusable = version == "HTTP/1.1" and "close" not in fields.get("connection", "")
        if status in (204, 304):
            self.length = 0
        elif "chunked" in fields.get("transfer-encoding", ""):
            self.chunked = True
        elif "content-length" in fields:
            self.length = int(fields["content-length"])
        else:
            self.reusable = False  # the body runs until the connection closes
        self.ended = self.length == 0
        assert self.head is not None
        self.head.set_result(Reply(self, status, headers))
        return True

    def _parse_body(self) -> None:
        data = self.buffer
        if not data or self.ended:
            return
        if self.length is not None:
            piece = data[:self.length]
            self.buffer = data[len(piece):]
            self.length -= len(piece)
            self.ended = self.length == 0
            self._deliver(piece)
        elif self.chunked:
            self._parse_chunks(data)
        else:
            self.buffer = b""
            self._deliver(data)

    def _parse_chunks(self, data: bytes) -> None:
        pieces, pos, end, left = [], 0, len(data), self.chunk_left
        while pos < end:
            if left > 0:  # inside a chunk's data
                piece = data[pos:pos + left]
                pieces.append(piece)
                pos += len(piece)
                left -= len(piece)
                if left:
                    break
                left = _DATA_END
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                break
            line, pos = data[pos:eol], eol + 2
            if left == _DATA_END:
                left = _SIZE
            elif left == _SIZE:
                size = int(line.partition(b";")[0], 16)
                if size < 0:
                    raise ValueError(f"chunk size {line[:20]!r}")
                left = size or _TRAILER
            elif not line:  # the empty line after the trailers ends the body
                self.ended = True
                break
        self.chunk_left, self.buffer = left, data[pos:]
        self._deliver(b"".join(pieces))

    def _deliver(self, piece: bytes) -> None:
        if piece:
            self.pieces.append(piece)
            self.buffered += len(piece)
            if self.buffered > PAUSE_ABOVE and self.transport is not None:
                self.transport.pause_reading()
        self._wake()
    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)
