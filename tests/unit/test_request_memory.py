"""What requests being read cost the gateway in memory (issue 31, finding 4): a body held stays
near what the shared budget counts, however small the chunks it comes in; a head, and the framing
between body bytes, are capped; and all of it is given back the moment its connection closes.
A client that pipelines requests and never reads their answers holds a bounded amount, answers
and pipelined bodies alike (issue 45, finding 1).
"""

from __future__ import annotations

import asyncio
import gc
import http.client
import json
import socket
import struct
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkctl.gateway.limits import Limits
from sparkctl.gateway.request import MAX_FIELDS, MAX_HEAD, SLICE, Request
from sparkctl.gateway.server import READ_AHEAD, Connection
from tests.conftest import ROOT, wait_for
from tests.teardown import stop
from tests.unit.wire import Transport

MiB = 1 << 20
CLIENTS, BODY, PIECE = 4, 8 * MiB, 16  # a body each, sent in 16-byte chunks and never finished
BUDGET = CLIENTS * BODY  # exactly what they hold: none of them is refused

ASSET = 22_000  # bytes: about the dashboard's script, /ui/app.js
# The gateway's server with a handler that reports the shared counters and what its other
# connections hold (answers not yet sent, requests waiting, bytes read but not parsed), answers
# /asset with ASSET bytes and never answers /slow (an engine taking its time); it exits when its
# stdin closes.
SERVER = """
import asyncio, sys
from sparkctl.gateway.limits import Limits
from sparkctl.gateway.server import serve

async def main() -> None:
    limits, loop, done = Limits(body_bytes=int(sys.argv[1])), asyncio.get_running_loop(), asyncio.Event()

    def handle(request, conn):
        if request.path == "/asset":
            conn.reply(200, b"a" * int(sys.argv[2]), "text/javascript")
        elif request.path != "/slow":
            live = [c for c in limits.live if c is not conn]
            conn.reply_json(200, {"held": limits.held, "open": limits.open,
                                  "unsent": sum(c.transport.get_write_buffer_size() for c in live),
                                  "waiting": sum(len(r.body) + 1 for c in live for r in c.queue),
                                  "unparsed": sum(len(getattr(c.reader, "rest", b"")) for c in live)})

    server = await serve(handle, "127.0.0.1", 0, limits=limits)
    print(server.sockets[0].getsockname()[1], flush=True)
    loop.add_reader(sys.stdin.fileno(), done.set)
    await done.wait()

asyncio.run(main())
"""


class Served:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.port = proc, int(proc.stdout.readline())

    def rss(self) -> int:
        """The server's resident memory, in bytes."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) * 1024

    def counters(self) -> dict[str, int]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", "/counters")
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    def gone(self) -> bool:
        """Whether the server holds nothing for any client but the one asking."""
        c = self.counters()
        return c["open"] == 1 and c["held"] == c["unsent"] == c["waiting"] == c["unparsed"] == 0

    def settled(self) -> dict[str, int]:
        """The counters once they stop changing (the server has done what the bytes sent let it)."""
        before = self.counters()
        while (now := self.counters()) != before:
            before = now
            time.sleep(0.2)
        return now

    def post(self, body: bytes, *, pieces: int = PIECE, finish: bool = True) -> socket.socket:
        """A connection that sends `body` chunked in `pieces`-byte chunks (and its last chunk if `finish`)."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=60)
        framed = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + pieces]), body[i:i + pieces])
                          for i in range(0, len(body), pieces))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + framed
                     + (b"0\r\n\r\n" if finish else b""))
        return sock


def pipeline(port: int, requests: bytes, *, within: float = 3.0) -> socket.socket:
    """A connection that sends as much of `requests` as the server takes within `within` s, and
    never reads (its receive buffer kept small, so the server's answers back up)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.settimeout(within)
    try:
        sock.sendall(requests)
    except (TimeoutError, ConnectionError):
        pass  # the server stopped reading, or refused and closed: what matters is what it holds now
    return sock


def reset(sock: socket.socket) -> None:
    """Close with a reset: a FIN would wait behind the bytes the server has not read."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@pytest.fixture
def served() -> Iterator[Served]:
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(BUDGET), str(ASSET)], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    try:
        yield Served(proc)
    finally:
        proc.stdin.close()
        stop(proc, 10)


def test_bodies_in_tiny_chunks_hold_what_the_budget_counts_and_free_it_on_close(served: Served) -> None:
    """Was ~25x: each chunk was kept as a bytes object of its own, and the pieces outlived their
    connection until the garbage collector found its reference cycle (~35 s). The gateway runs in
    a subprocess so that its resident memory can be read from /proc: an in-process test could
    count objects, not what the operating system sees."""
    for _ in range(3):  # warm-up: the code paths, and the allocator's first arenas
        with served.post(b"w" * 65536) as sock:
            assert sock.recv(4096).startswith(b"HTTP/1.1 200 ")
    wait_for(lambda: served.counters()["open"] == 1, what="the warm-up connections to close")
    start = served.rss()

    clients = [served.post(b"b" * BODY, finish=False) for _ in range(CLIENTS)]
    try:
        wait_for(lambda: served.counters()["held"] == BUDGET, timeout=120, what="the server to read every body")
        holding = served.rss()
        assert holding - start <= 2 * BUDGET, f"{(holding - start) / MiB:.0f} MiB held for {BUDGET / MiB:.0f} MiB"
    finally:
        for sock in clients:
            sock.close()
    wait_for(served.gone, what="the server to see its clients go")
    wait_for(lambda: served.rss() <= start * 1.1, timeout=1,  # already, once the closes are handled
             what=f"memory back to {start / MiB:.0f} MiB (at {served.rss() / MiB:.0f} MiB)")
    print(f"rss: start {start / MiB:.1f} MiB, holding {holding / MiB:.1f} MiB, closed {served.rss() / MiB:.1f} MiB")


def test_a_client_that_pipelines_and_never_reads_holds_a_bounded_amount(served: Served) -> None:
    """Was linear in what the client sent: every pipelined request was answered into the
    connection's write buffer whether or not the client read (1 MB of `GET /ui/app.js` took the
    daemon from 110 to 539 MB). Now nothing more is answered or parsed while the write side is
    paused. The counts are the server's own (its transports' buffers); the memory is /proc's."""
    wait_for(served.gone, what="the server to start")
    start = served.rss()
    requests = b"GET /asset HTTP/1.1\r\nHost: x\r\n\r\n" * 4000  # ~88 MB of answers, were they all written
    with pipeline(served.port, requests):
        holding = served.settled()
        grown = served.rss() - start
        assert holding["unsent"] <= 64 * 1024 + ASSET, holding  # the write buffer's high-water mark, one answer
        assert holding["waiting"] <= 17 * SLICE // 30 and holding["unparsed"] <= len(requests), holding
        assert grown <= 16 * MiB, f"{grown / MiB:.0f} MiB held"
    wait_for(served.gone, what="the server to see its client go")
    wait_for(lambda: served.rss() <= start * 1.1, timeout=5,
             what=f"memory back to {start / MiB:.0f} MiB (at {served.rss() / MiB:.0f} MiB)")


def test_pipelined_bodies_are_charged_to_the_budget_and_freed_on_close(served: Served) -> None:
    """Were not: a request's body was given back to the budget once it was complete, so bodies
    waiting behind one being answered were held uncounted (two connections x 16 x 32 MiB: 98 ->
    1,139 MB). Here two clients each pipeline twice the budget of bodies behind a request that
    is never answered: what is read behind it is bounded, and charged."""
    body = b"b" * (4 * MiB)
    post = b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    reset(pipeline(served.port, post * 3))  # warm-up: the allocator's first bodies of this size
    wait_for(served.gone, what="the warm-up client to go")
    start = served.rss()
    clients = [pipeline(served.port, post * (2 * BUDGET // len(body)), within=2.0) for _ in range(2)]
    try:
        holding = served.settled()
        grown = served.rss() - start
        assert holding["held"] <= 2 * (len(body) + READ_AHEAD + SLICE), holding  # the one answered, and read-ahead
        assert grown <= 2 * BUDGET, f"{grown / MiB:.0f} MiB held for a budget of {BUDGET / MiB:.0f} MiB"
    finally:
        for sock in clients:
            reset(sock)
    wait_for(served.gone, what="the server to see its clients go")  # while it reads nothing from them
    # glibc may keep one freed chunk of a body's size in its heap (the daemon trims it after work)
    wait_for(lambda: served.rss() <= start * 1.1 + len(body), timeout=5,
             what=f"memory back to {start / MiB:.0f} MiB (at {served.rss() / MiB:.0f} MiB)")


HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
CHUNKED = HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
# Heads (and trailers) that never end, each fed until the gateway answers: (start, what repeats, status).
ENDLESS = {
    "header value": (HEAD + b"X-A: ", b"a" * 1024, 431),
    "target": (b"GET /", b"a" * 1024, 431),
    "header lines": (HEAD, b"X-A: 1\r\n" * 128, 431),
    "trailer value": (CHUNKED + b"3\r\nabc\r\n0\r\nX-T: ", b"t" * 1024, 400),
    "trailer lines": (CHUNKED + b"3\r\nabc\r\n0\r\n", b"X-T: 1\r\n" * 128, 431),
}


@pytest.mark.parametrize("name", ENDLESS)
def test_a_head_or_trailers_past_the_cap_are_refused_before_they_are_held(name: str) -> None:
    """httptools keeps an unfinished header line to itself and had no cap: one such connection
    could hold any amount of memory, none of it counted by the body budget."""
    start, again, status = ENDLESS[name]

    async def run() -> tuple[bytes, int]:
        conn, transport = Connection(lambda request, conn: None), Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(start)
        fed = len(start)
        while not transport.written and fed < 1 << 20:
            conn.data_received(again)
            fed += len(again)
        conn.connection_lost(None)
        return transport.written, fed

    written, fed = asyncio.run(run())
    assert written.startswith(b"HTTP/1.1 %d " % status), written[:80]
    assert fed <= MAX_HEAD + SLICE + 1024 or name.endswith("lines")


def test_a_head_under_the_caps_is_read() -> None:
    lines = b"".join(b"X-%d: 1\r\n" % i for i in range(MAX_FIELDS - 3))  # with Host, Cookie, Content-Length
    head = HEAD + b"Cookie: " + b"c" * (MAX_HEAD - 2048) + b"\r\n" + lines + b"Content-Length: 2\r\n\r\n{}"
    seen = []

    def handle(request: Request, conn: Connection) -> None:
        seen.append(request)
        conn.reply(200, b"", "text/plain")

    async def run() -> bytes:
        conn, transport = Connection(handle), Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(head)
        return transport.written

    assert asyncio.run(run()).startswith(b"HTTP/1.1 200 ")
    assert len(seen[0].headers) == MAX_FIELDS and seen[0].body == b"{}"


def test_a_closed_connection_is_freed_at_once_with_the_requests_queued_on_it() -> None:
    """Its reader linked back to it strongly, a reference cycle: a connection that closed, with
    the bodies of the pipelined requests waiting behind the one being answered, stayed in memory
    until the garbage collector's next full pass."""
    limits = Limits()
    body = b"b" * (1 << 18)  # four of them within READ_AHEAD
    pipelined = (HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body) * 4

    async def run() -> weakref.ref:
        conn, transport = Connection(lambda request, conn: None, limits=limits), Transport()  # never answers
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(pipelined + HEAD + b"Content-Length: 100\r\n\r\npart")
        assert len(conn.queue) == 3 and limits.held == 4 * len(body) + 4  # the queued bodies are charged too
        conn.connection_lost(ConnectionResetError())
        return weakref.ref(conn)

    gc.disable()
    try:
        gone = asyncio.run(run())
        assert gone() is None and limits.held == 0 and not limits.live
    finally:
        gc.enable()


def test_a_connection_keeps_no_view_of_a_read_it_has_parsed() -> None:
    """An empty slice of the socket's last read still holds all of it (up to 256 KiB), for as
    long as the connection stays open idle."""
    data = b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n" * 5000

    async def run() -> Connection:
        conn, transport = Connection(lambda request, conn: conn.reply(200, b"", "text/plain")), Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(data)
        assert transport.written.count(b"HTTP/1.1 200 ") == 5000
        return conn

    assert asyncio.run(run()).reader.rest.obj is not data
