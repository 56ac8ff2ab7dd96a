"""The gateway's listening side: a small HTTP/1.1 server made for proxying streams.

Each connection reads its requests with a `RequestReader` (`request.py`: llhttp's framing and
the checks a front proxy needs). A request is handed to its handler from the socket's own
callback the moment its last byte arrives, and a handler answers by writing to the connection
directly, so a proxied request reaches its engine, and each token its client, without waiting in
the event loop's queue behind the other streams (which is what a task per request costs a busy
general-purpose server). Handlers that must wait (a held alias, a full concurrency cap) start a
task of their own. Requests on one keep-alive connection are answered in order. Connections are
capped (`Limits`: at the cap the connection idle the longest makes room, else a few more are let
in for `/health` and the owner), and so are the bytes of request bodies held at once across all
of them, and the time a request takes to arrive (a 408 after `Limits.upload_time`).

A connection holds a bounded amount however its client behaves. While its write side is paused
(the client does not read what it was sent) no further request is answered and nothing more is
read or parsed; at most `PIPELINED` complete requests, and `READ_AHEAD` bytes of their bodies,
wait behind the one being answered, charged to the shared budget until answered (an answer that
streams for hours must not keep 16 bodies of 32 MiB behind it); and everything it holds is
dropped when it closes. A connection that reads nothing cannot see its client leave, so while
reading is held back the kernel's view of the socket is checked every `WATCH` seconds: a client
that reset, or whose close reached the kernel, no longer keeps what it sent queued, and charged,
for as long as the request before it takes (a close stuck behind bytes not yet read is seen at
the next write). A close with bytes still unsent waits `LINGER` seconds for the client to read
them, then the connection is aborted.

Every request ends in an answer or a close, whatever a handler raises: the connection runs each
handler, and each task a handler starts (`Connection.task`), and answers a 500 in the OpenAI
envelope (or closes, once part of the response is out) when one raises. A request left without
either would keep its connection open, with reading paused, for good: one slot of the cap lost.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Protocol

import structlog

from sparkctl.gateway.http1 import chunk, response_head
from sparkctl.gateway.limits import Limits
from sparkctl.gateway.request import Admit, Answer, Request, RequestReader

KEEP_ALIVE = 75.0  # seconds an idle client connection is kept open
PIPELINED = 16  # complete requests waiting behind the one being answered, before parsing stops
READ_AHEAD = 1 << 20  # body bytes read behind the request being answered, before parsing stops
FINISH_GRACE = 1.0  # seconds an idle connection stays open once the server stops
LINGER = 30.0  # seconds a closed connection's unsent bytes wait for its client to read them
WATCH = 2.0  # seconds between checks that the client of a connection not being read is still there
TCP_CLOSED = (7, 8)  # TCP_CLOSE, TCP_CLOSE_WAIT (include/net/tcp_states.h): the client closed its side
log = structlog.get_logger()


class Exchange(Protocol):
    """What a handler leaves behind while it answers: told when the client goes or stalls."""

    def cancel(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...


Handler = Callable[[Request, "Connection"], None]


class Connection(asyncio.Protocol):
    """One client connection: requests parsed as bytes arrive and answered one at a time."""

    def __init__(self, handle: Handler, admit: Admit | None = None, limits: Limits | None = None,
                 owner: Callable[[Request], bool] | None = None) -> None:
        """`owner` tells a request of the owner's, let in past the cap."""
        self.handle, self.limits, self.owner = handle, limits or Limits(), owner
        self.reader = RequestReader(self, admit, self.limits)
        self.transport: asyncio.Transport | None = None
        self.queue: deque[Request] = deque()  # complete requests waiting for their turn
        self.refusal: Answer | None = None  # the last answer on this connection, once the queue is done
        self.request: Request | None = None  # being answered
        self.exchange: Exchange | None = None  # the handler's, while it answers
        self.closed = self.paused = self.keep_alive = self.chunked = self.dispatching = False
        self.held = 0  # body bytes of its complete requests not yet answered, charged to `limits`
        self.reserved = False  # let in past the cap: for /health and the owner, one request
        self.sent = False  # whether any byte of the current response was written
        self.pending_head = b""  # a streamed response's head, sent with its first piece
        self.timer: asyncio.TimerHandle | None = None
        self.watch: asyncio.TimerHandle | None = None  # while reading is held back
        self.upload: asyncio.TimerHandle | None = None  # while a request arrives

    # --- the handler's side --------------------------------------------------------------------
    def reply(self, status: int, body: bytes, content_type: str, headers: Sequence[tuple[str, str]] = ()) -> None:
        """A whole response."""
        if self.closed:
            return
        head = [("Content-Type", content_type), ("Content-Length", str(len(body))), *headers]
        self.transport.write(response_head(status, self._connection(head)) + (b"" if self._bodiless() else body))
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
        data = b"" if self._bodiless() else chunk(piece, last) if self.chunked else piece
        if self.pending_head:
            data, self.pending_head = self.pending_head + data, b""
        if data:
            self.transport.write(data)
            self.sent = True
        if last:
            self._done()

    def task(self, step: Coroutine[None, None, None]) -> asyncio.Task[None]:
        """Run a step of the current request's answer as a task (a wait at a hold or a cap); if it
        raises, the request still ends, as when the handler itself raises."""
        request, task = self.request, asyncio.ensure_future(step)

        def ended(done: asyncio.Task[None]) -> None:
            if not done.cancelled() and done.exception() is not None and self.request is request:
                self._failed(done.exception())

        task.add_done_callback(ended)
        return task

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

    def close(self, *, now: bool = False) -> None:
        """Close once the bytes written are sent (at most `LINGER` s), or `now`, dropping them."""
        self.closed = True
        self._release()
        if self.transport is None:
            return
        if now:
            self.transport.abort()
            return
        self.transport.close()
        if self.transport.get_write_buffer_size():  # a client that never reads them must not keep them
            asyncio.get_running_loop().call_later(LINGER, self.transport.abort)

    # --- asyncio's side -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        limits = self.limits
        if limits.open >= limits.connections and not limits.make_room():
            self.reserved = True
        if limits.open >= limits.connections + limits.reserve:
            self.limits.refused += 1
            transport.write(response_head(503, [("Content-Length", "0"), ("Connection", "close")]))
            self.closed = True
            transport.close()
            return
        self.limits.enter(self)
        self._idle()
        if self.limits.finishing:  # accepted just before the listener closed
            self.finish()

    def data_received(self, data: bytes) -> None:
        if self.closed or self.refusal is not None:
            return
        self.reader.feed(data)
        self._flow()

    def eof_received(self) -> bool:
        self._gone()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone()

    def pause_writing(self) -> None:
        self.paused = True
        if self.exchange is not None:
            self.exchange.pause()
        self._flow()

    def resume_writing(self) -> None:
        self.paused = False
        if self.exchange is not None:
            self.exchange.resume()
        self._dispatch()

    # --- the reader's side, from inside its parser's callbacks ----------------------------------
    def wants_requests(self) -> bool:
        """Whether the reader may parse on: not while the client leaves answers unread, nor while
        `PIPELINED` requests, or `READ_AHEAD` bytes of bodies, wait behind the one being answered."""
        if self.closed or self.refusal is not None or self.paused or len(self.queue) >= PIPELINED:
            return False
        return self.request is None or self.held - len(self.request.body) + len(self.reader.body) < READ_AHEAD

    def began(self) -> None:
        """A request's first byte was parsed: it has `upload_time` to arrive whole."""
        if self.timer is not None:
            self.timer.cancel()
        self.upload = asyncio.get_running_loop().call_later(self.limits.upload_time, self._too_slow)

    def headed(self, request: Request) -> Answer | None:
        """A request's head is complete: the connection is busy; past the cap, only a request
        for /health or of the owner's is answered."""
        self.limits.busy(self)
        if not self.reserved or request.path == "/health" or (self.owner is not None and self.owner(request)):
            return None
        return lambda conn: error(conn, 503, "the gateway is at its connection cap; retry shortly",
                                  "too_many_connections", headers=[("Retry-After", "1")])

    def received(self, request: Request) -> None:
        """A complete request: queued behind those before it, and answered in its turn."""
        if self.upload is not None:
            self.upload.cancel()
        self.queue.append(request)
        self.held += len(request.body)
        self._dispatch()

    def refuse(self, answer: Answer) -> None:
        """Stop reading this connection: `answer` is its last response, after those queued."""
        self.refusal = answer
        self.reader.release()
        self._dispatch()

    def send_continue(self) -> None:
        """Tell a client that sent `Expect: 100-continue` to send its body, when no earlier
        response is still to be written (the client waits for it, or for a timeout)."""
        if self._idle_now():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    # --- requests -------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        """Answer what is queued, in order, and parse on what was kept while the client lets us
        (a loop, not recursion, since handlers often answer at once)."""
        if self.dispatching:
            return
        self.dispatching = True
        try:
            while not self.closed:
                if self.request is None and self.queue and not self.paused:
                    if self.timer is not None:
                        self.timer.cancel()
                    self.request = self.queue.popleft()
                    self.limits.busy(self)
                    self.keep_alive = self.request.keep_alive and not self.limits.finishing and not self.reserved
                    self._guarded(self.handle, self.request, self)
                elif self.request is None and self.refusal is not None and not self.queue:
                    self.keep_alive, self.request = False, Request("", "", {}, b"")
                    self._guarded(self.refusal, self)
                elif self.reader.rest and not self.reader.parsing and self.wants_requests():
                    self.reader.parse()
                else:
                    break
        finally:
            self.dispatching = False
        self._flow()

    def _flow(self) -> None:
        """Read from the socket only while the reader has nothing kept and may parse on."""
        if self.closed or self.transport is None:
            return
        if self.wants_requests() and not self.reader.rest:
            self.transport.resume_reading()
        else:
            self.transport.pause_reading()
            if self.watch is None:
                self.watch = asyncio.get_running_loop().call_later(WATCH, self._check)

    def _check(self) -> None:
        """While reading is held back: a client that closed is gone (the socket says so)."""
        self.watch = None
        if self.closed or self.transport.is_reading():
            return
        if _peer_closed(self.transport.get_extra_info("socket")):
            self.transport.abort()
        else:
            self.watch = asyncio.get_running_loop().call_later(WATCH, self._check)

    def _guarded(self, answer: Callable[..., None], *args: object) -> None:
        try:
            answer(*args)
        except Exception as e:  # noqa: BLE001 - whatever a handler raises, its request must end
            self._failed(e)

    def _failed(self, e: BaseException) -> None:
        """A handler raised: answer 500, or close if part of the response is already out. Its
        exchange is cancelled first (an upstream call it started is closed)."""
        request = self.request
        log.error("gateway_handler_failed", method=request.method if request else "", error=repr(e)[:200],
                  path=request.path[:200] if request else "")
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            try:
                exchange.cancel()
            except Exception as cancel_error:  # noqa: BLE001 - the close below matters more
                log.error("gateway_cancel_failed", error=repr(cancel_error)[:200])
        if self.closed or request is None:
            return
        self.keep_alive = False
        if self.sent:
            self.close()
            return
        self.pending_head, self.chunked = b"", False
        error(self, 500, f"sparkctl's gateway failed on this request ({type(e).__name__}); see the daemon's log",
              "internal_error")

    def _done(self) -> None:
        """The response has been written: its body's charge given back, on to the next request, or close."""
        self.held -= len(self.request.body)
        self.limits.held -= len(self.request.body)
        self.request, self.exchange, self.chunked, self.sent = None, None, False, False
        if not self.keep_alive:
            self.close()
            return
        self._idle()
        self._dispatch()

    def _bodiless(self) -> bool:
        return self.request is not None and self.request.method == "HEAD"

    def _release(self) -> None:
        """Drop what the connection holds of its requests, and its charge to the shared budget."""
        self.reader.release()
        self.limits.held -= self.held
        self.held = 0
        self.queue.clear()
        for timer in (self.watch, self.upload):
            if timer is not None:
                timer.cancel()

    def _idle_now(self) -> bool:
        return self.request is None and not self.queue

    def _gone(self) -> None:
        self.limits.leave(self)
        if self.timer is not None:  # else a connection closed from this side lives on to its keep-alive timer
            self.timer.cancel()
        if self.closed and self.exchange is None:
            return
        self.closed = True
        self._release()
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.cancel()
        if self.transport is not None:
            self.transport.close()

    def _idle(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = asyncio.get_running_loop().call_later(KEEP_ALIVE, self.close)
        if self._idle_now() and (self.reader.incoming is None or not self.reader.headed):
            self.limits.rest(self)  # nothing to answer, and no request's head in

    def _too_slow(self) -> None:
        self.upload = None
        seconds = self.limits.upload_time
        self.refuse(lambda conn: error(conn, 408, f"the request did not arrive whole within {seconds:g} s",
                                       "request_timeout"))

    def _connection(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return headers if self.keep_alive else [*headers, ("Connection", "close")]


def _peer_closed(sock: socket.socket | None) -> bool:
    """Whether the other end of a TCP socket has closed its side, as the kernel sees it."""
    try:
        return sock is not None and sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] in TCP_CLOSED
    except OSError:
        return False


def envelope(message: str, code: str) -> dict[str, object]:
    """The OpenAI error envelope, marked as coming from sparkctl rather than the model server."""
    return {"error": {"message": message, "type": code, "param": None, "code": code, "source": "sparkctl"}}


def error(conn: Connection, status: int, message: str, code: str, *, headers: Sequence[tuple[str, str]] = ()) -> None:
    """An error answer of sparkctl's own, in the `envelope`."""
    conn.reply_json(status, envelope(message, code), headers)


async def serve(handle: Handler, host: str, port: int, *, admit: Admit | None = None,
                limits: Limits | None = None, owner: Callable[[Request], bool] | None = None,
                sock: socket.socket | None = None) -> asyncio.Server:
    """Listen on host:port (or on `sock`, a listening socket handed over), handing each request to
    `handle` (after `admit`, if given); `owner` tells the owner's requests, let in past the cap."""
    shared = limits or Limits()
    loop = asyncio.get_running_loop()
    if sock is not None:
        return await loop.create_server(lambda: Connection(handle, admit, shared, owner), sock=sock)
    return await loop.create_server(lambda: Connection(handle, admit, shared, owner), host, port)
