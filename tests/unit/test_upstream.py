"""The gateway's lean HTTP/1.1 client: response framing fuzzed byte by byte, then keep-alive,
retries and failures against scripted servers on real loopback sockets."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkctl.gateway.pool import EnginePool
from sparkctl.gateway.upstream import Call, EngineConnection, UpstreamError
from tests.unit.wire import Transport, split


class Collect:
    """A sink that keeps the answer: `outcome` is (status, body) or the error, once it ends."""

    def __init__(self, on_piece: Callable[[Collect], None] = lambda _: None) -> None:
        self.status, self.pieces, self.on_piece = 0, [], on_piece
        self.outcome: tuple[int, bytes] | UpstreamError | None = None
        self.ended = asyncio.Event()
        self.call: Call | None = None

    def head(self, status: int, headers: list[tuple[str, str]], length: int | None) -> None:
        self.status = status

    def body(self, piece: bytes, last: bool) -> None:
        assert self.outcome is None, "a piece after the end"
        self.pieces.append(piece)
        self.on_piece(self)
        if last:
            self._end((self.status, b"".join(self.pieces)))

    def failed(self, error: UpstreamError) -> None:
        assert self.outcome is None, "a failure after the end"
        self._end(error)

    def _end(self, outcome: tuple[int, bytes] | UpstreamError) -> None:
        self.outcome = outcome
        self.ended.set()

    async def result(self) -> tuple[int, bytes]:
        await self.ended.wait()
        if isinstance(self.outcome, UpstreamError):
            raise self.outcome
        assert self.outcome is not None
        return self.outcome


def chunked(parts: list[bytes], extension: bool, trailer: bool) -> bytes:
    ext = b";name=value" if extension else b""
    body = b"".join(b"%x%s\r\n%s\r\n" % (len(p), ext, p) for p in parts if p)
    return body + b"0\r\n" + (b"X-Trailer: yes\r\n" if trailer else b"") + b"\r\n"


def feed(segments: list[bytes], *, close: bool = False) -> tuple[Collect, EngineConnection]:
    """`segments` delivered to a connection as its engine's answer, one callback each."""
    pool, address, sink = EnginePool(), ("127.0.0.1", 1), Collect()
    conn = EngineConnection(pool, address)
    conn.connection_made(Transport())  # type: ignore[arg-type]
    conn.send(Call(pool, address, b"POST / HTTP/1.1\r\n\r\n", sink))
    for segment in segments:
        if conn.call is None:
            break
        conn.data_received(segment)
    if close:
        conn.connection_lost(None)
    return sink, conn


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(st.binary(max_size=300), max_size=8), extension=st.booleans(), trailer=st.booleans(),
       cuts=st.lists(st.integers(0, 5000), max_size=12), framing=st.sampled_from(["chunked", "length"]))
def test_a_body_arrives_whole_however_the_bytes_are_split(parts, extension, trailer, cuts, framing) -> None:
    body = b"".join(parts)
    if framing == "chunked":
        raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(parts, extension, trailer)
    else:
        raw = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    sink, conn = feed(split(raw, cuts))
    assert sink.outcome == (200, body)
    assert conn in conn.pool.idle[conn.address] and not conn.closed  # pooled for the next request


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=400), cuts=st.lists(st.integers(0, 500), max_size=6))
def test_garbage_from_an_engine_ends_in_an_upstream_error_or_a_body(raw, cuts) -> None:
    sink, conn = feed(split(b"HTTP/1.1 200 OK\r\n" + raw, cuts), close=True)
    assert sink.outcome is not None  # answered exactly once (Collect checks), never left hanging
    assert isinstance(sink.outcome, UpstreamError) or sink.outcome[0] == 200


# --- scripted engines on loopback -------------------------------------------------------------
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    return await reader.readexactly(length)


def serve(script: Script, test: Callable[[EnginePool, str, list[int]], Awaitable[None]], **pool: float) -> list[int]:
    """Run `test` against a server answering each connection with `script`; returns its connection ids."""
    connections: list[int] = []

    async def main() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(len(connections))
            try:
                await script(reader, writer, connections[-1])
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        upstreams = EnginePool(**pool)
        try:
            await test(upstreams, f"http://127.0.0.1:{port}", connections)
        finally:
            upstreams.close()
            server.close()

    asyncio.run(main())
    return connections


async def text(upstreams: EnginePool, url: str, body: bytes = b"{}") -> tuple[int, bytes]:
    sink = Collect()
    upstreams.post(url, "/v1/completions", body, sink)
    return await sink.result()


async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
    while True:
        body = await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()


def test_requests_reuse_one_connection_and_bodies_arrive_intact() -> None:
    async def test(upstreams: EnginePool, url: str, connections: list[int]) -> None:
        for i in range(5):
            assert await text(upstreams, url, b'{"n": %d}' % i) == (200, b'{"n": %d}' % i)

    assert len(serve(keep_alive, test)) == 1


def test_an_idle_connection_past_the_timeout_is_not_reused() -> None:
    async def test(upstreams: EnginePool, url: str, connections: list[int]) -> None:
        await text(upstreams, url)
        await asyncio.sleep(0.1)
        await text(upstreams, url)

    assert len(serve(keep_alive, test, idle_timeout=0.05)) == 2


def test_a_reused_connection_the_engine_closed_unanswered_is_retried_once_on_a_fresh_one() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        if n == 0:
            await read_request(reader)  # the second request on this connection: dropped unanswered

    async def test(upstreams: EnginePool, url: str, connections: list[int]) -> None:
        assert await text(upstreams, url) == (200, b"ok")
        assert await text(upstreams, url) == (200, b"ok")

    assert len(serve(script, test)) == 2


def test_a_fresh_connection_closed_unanswered_is_an_error_not_a_retry() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)

    async def test(upstreams: EnginePool, url: str, connections: list[int]) -> None:
        with pytest.raises(UpstreamError, match="closed the connection before answering"):
            await text(upstreams, url)

    assert len(serve(script, test)) == 1


def test_an_engine_dying_mid_stream_is_an_error_and_its_connection_is_not_pooled() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"6\r\ndata: \r\n" if n == 0 else OK)
        await writer.drain()
        if n:
            await read_request(reader)

    async def test(upstreams: EnginePool, url: str, connections: list[int]) -> None:
        with pytest.raises(UpstreamError, match="mid-response"):
            await text(upstreams, url)
        assert await text(upstreams, url) == (200, b"ok")

    assert len(serve(script, test)) == 2


def test_a_cancelled_call_closes_its_connection_and_hears_nothing_more() -> None:
    closed = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nfirst \r\n")
        await writer.drain()
        await reader.read()  # until the gateway closes the connection
        closed.set()

    async def test(upstreams: EnginePool, url: str, connections: list[int]) -> None:
        sink = Collect(on_piece=lambda s: s.call.cancel() if s.pieces[-1] else None)
        sink.call = upstreams.post(url, "/", b"{}", sink)
        await asyncio.wait_for(closed.wait(), 5)
        assert sink.pieces[-1] == b"first " and sink.outcome is None and not upstreams.idle.get(sink.call.address)

    serve(script, test)


def test_a_body_framed_by_the_connection_end_and_a_bodyless_204() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n" if n == 0 else b"HTTP/1.0 200 OK\r\n\r\nuntil the end")

    async def test(upstreams: EnginePool, url: str, connections: list[int]) -> None:
        assert await text(upstreams, url) == (204, b"")
        assert await text(upstreams, url) == (200, b"until the end")

    serve(script, test)


def test_refused_and_malformed_answers_are_upstream_errors() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 abc\r\n\r\n")

    async def test(upstreams: EnginePool, url: str, connections: list[int]) -> None:
        with pytest.raises(UpstreamError, match="bad response from the engine"):
            await text(upstreams, url)

    serve(script, test)

    async def refused() -> None:
        with pytest.raises(UpstreamError, match="cannot connect to 127.0.0.1:9"):
            await text(EnginePool(), "http://127.0.0.1:9")

    asyncio.run(refused())


def test_a_large_stream_to_a_client_that_stalls_pauses_the_engine_and_arrives_whole() -> None:
    parts = [random.Random(i).randbytes(random.Random(i).randint(1, 70_000)) for i in range(120)]
    stalls, reading = [], []  # while the client stalls, whether the engine's socket is read

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(parts, False, False))
        await writer.drain()

    def stall(sink: Collect) -> None:  # every 4th piece the client stops reading for a while
        if len(sink.pieces) % 4 == 0:
            sink.call.pause()
            stalls.append(asyncio.get_running_loop().call_later(0.05, check_and_resume, sink))

    def check_and_resume(sink: Collect) -> None:
        reading.append(sink.call.conn.transport.is_reading())
        sink.call.resume()

    async def test(upstreams: EnginePool, url: str, connections: list[int]) -> None:
        sink = Collect(on_piece=stall)
        sink.call = upstreams.post(url, "/", b"{}", sink)
        assert await sink.result() == (200, b"".join(parts))
        assert len(reading) == len(stalls) >= 3 and not any(reading)

    serve(script, test)


def test_a_stall_bound_ends_a_silent_stream_but_not_one_its_caller_keeps_paused() -> None:
    """`stall` counts the engine's silence, not the caller's: while the caller keeps reading paused
    (its client is slow) far past the bound, the stream lives on; a silent engine fails the call."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        await read_request(reader)
        writer.write(head + chunked([b"first ", b"second"], False, False))
        await read_request(reader)  # the next request, on the kept-alive connection
        writer.write(head + b"6\r\nfirst \r\n")
        await reader.read()  # then silent, until the gateway closes

    def hold_back(sink: Collect) -> None:  # the caller stops reading after the first piece, for 4 bounds
        if len(sink.pieces) == 1:
            sink.call.pause()
            asyncio.get_running_loop().call_later(0.4, sink.call.resume)

    async def test(upstreams: EnginePool, url: str, connections: list[int]) -> None:
        paused = Collect(on_piece=hold_back)
        paused.call = upstreams.post(url, "/", b"{}", paused, stall=0.1)
        assert await paused.result() == (200, b"first second")
        silent = Collect()
        silent.call = upstreams.post(url, "/", b"{}", silent, stall=0.1)
        with pytest.raises(UpstreamError, match="sent nothing for 0.1 s") as failure:
            await silent.result()
        assert failure.value.stalled and not failure.value.unanswered and silent.pieces == [b"first "]
        assert not upstreams.idle.get(silent.call.address)  # its connection was closed, not pooled

    assert len(serve(script, test)) == 1


def test_a_first_byte_bound_alone_ends_only_the_wait_for_the_answer() -> None:
    """A whole answer (no `stall`): its engine may take no longer than `first_byte` to start it, and
    any time after that."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nfirst ")
        await asyncio.sleep(0.4)  # four bounds between the answer's first byte and its last
        writer.write(b"second")
        await read_request(reader)  # the next request, on the kept-alive connection: never answered
        await reader.read()

    async def test(upstreams: EnginePool, url: str, connections: list[int]) -> None:
        slow = Collect()
        slow.call = upstreams.post(url, "/", b"{}", slow, first_byte=0.1)
        assert await slow.result() == (200, b"first second")
        hung = Collect()
        hung.call = upstreams.post(url, "/", b"{}", hung, first_byte=0.1)
        with pytest.raises(UpstreamError, match="sent nothing for 0.1 s") as failure:
            await hung.result()
        assert failure.value.stalled and failure.value.unanswered and hung.pieces == []

    assert len(serve(script, test)) == 1
