"""The gateway's HTTP/1.1 server side: requests fuzzed and split byte by byte, pipelining,
100-continue, refusals, and what a client going away or stalling tells the handler's exchange."""

from __future__ import annotations

import asyncio
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkctl.gateway.server import MAX_BODY, Connection, Request
from tests.unit.wire import Transport, split


class _Exchange:
    def __init__(self) -> None:
        self.events: list[str] = []

    def cancel(self) -> None:
        self.events.append("cancel")

    def pause(self) -> None:
        self.events.append("pause")

    def resume(self) -> None:
        self.events.append("resume")


def echo(request: Request, conn: Connection) -> None:
    """Answers each request with what it understood of it."""
    conn.reply_json(200, {"method": request.method, "path": request.path, "body": request.body.decode("latin-1")})


def connect(handle=echo) -> tuple[Connection, Transport]:
    conn, transport = Connection(handle), Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def answers(written: bytes) -> list[tuple[int, dict]]:
    """(status, JSON body) of each whole response written."""
    out = []
    while written:
        head, _, rest = written.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        out.append((int(head[9:12]), json.loads(rest[:length]) if rest[:1] == b"{" else {}))
        written = rest[length:]
    return out


def request(method: str, path: str, body: bytes, chunked: bool) -> bytes:
    if chunked:
        pieces = [body[i:i + 7] for i in range(0, len(body), 7)]
        framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
        return f"{method} {path}?q=1 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode() + framed
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


@settings(max_examples=300, deadline=None)
@given(messages=st.lists(st.tuples(st.sampled_from(["GET", "POST"]), st.sampled_from(["/v1/models", "/a/b"]),
                                   st.binary(max_size=200), st.booleans()), min_size=1, max_size=4),
       cuts=st.lists(st.integers(0, 2000), max_size=10))
def test_pipelined_requests_are_answered_in_order_however_the_bytes_are_split(messages, cuts) -> None:
    async def run() -> bytes:
        conn, transport = connect()
        for segment in split(b"".join(request(*m) for m in messages), cuts):
            conn.data_received(segment)
        return transport.written

    got = answers(asyncio.run(run()))
    assert [(200, {"method": m, "path": p, "body": b.decode("latin-1")}) for m, p, b, _ in messages] == got


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=300), cuts=st.lists(st.integers(0, 400), max_size=6))
def test_garbage_is_a_400_or_waits_for_more_never_a_crash(raw, cuts) -> None:
    async def run() -> tuple[bytes, bool]:
        conn, transport = connect()
        for segment in split(b"POST /v1/completions HTTP/1.1\r\n" + raw, cuts):
            if transport.closed:
                break
            conn.data_received(segment)
        return transport.written, transport.closed

    written, closed = asyncio.run(run())
    assert written == b"" or written.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 413 ", b"HTTP/1.1 200 ",
                                                 b"HTTP/1.1 100 "))
    assert closed == written.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 413 "))


def test_expect_100_continue_is_answered_before_the_body_arrives() -> None:
    async def run() -> None:
        conn, transport = connect()
        conn.data_received(b"POST /x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
        assert transport.written == b"HTTP/1.1 100 Continue\r\n\r\n"
        conn.data_received(b"ab")
        conn.data_received(b"cd")
        assert answers(transport.written[25:]) == [(200, {"method": "POST", "path": "/x", "body": "abcd"})]

    asyncio.run(run())


def test_a_body_over_the_limit_is_a_413_and_the_connection_closes() -> None:
    async def run() -> None:
        conn, transport = connect()
        conn.data_received(b"POST /x HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1))
        assert transport.written.startswith(b"HTTP/1.1 413 ") and transport.closed

    asyncio.run(run())


def test_http_1_0_and_connection_close_end_the_connection_after_the_answer() -> None:
    async def run() -> None:
        for head in (b"GET /x HTTP/1.0\r\n\r\n", b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n"):
            conn, transport = connect()
            conn.data_received(head)
            assert b"Connection: close" in transport.written and transport.closed
        conn, transport = connect()
        conn.data_received(b"GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert not transport.closed

    asyncio.run(run())


def test_a_client_that_stalls_or_leaves_is_told_to_the_exchange() -> None:
    exchange = _Exchange()

    def streaming(request: Request, conn: Connection) -> None:
        conn.exchange = exchange
        conn.start(200, [("Content-Type", "text/event-stream")], None)

    async def run() -> Transport:
        conn, transport = connect(streaming)
        conn.data_received(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
        conn.send(b"data: 1\n\n", False)
        conn.pause_writing()
        conn.resume_writing()
        conn.connection_lost(ConnectionResetError())
        conn.send(b"data: 2\n\n", False)  # after the client left: dropped
        return transport

    transport = asyncio.run(run())
    assert exchange.events == ["pause", "resume", "cancel"]
    assert b"Transfer-Encoding: chunked" in transport.written
    assert transport.written.endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n")
