"""One proxied request, from routing until its answer has been passed on, failed or been
abandoned by its client.

It joins the two sockets: as the upstream call's `Sink` (`upstream.py`) it writes each piece of
the engine's answer to the client as it arrives, and as the client connection's `Exchange`
(`server.py`) it passes a client that goes away, or stops reading, on to the engine's call. An
engine that fails is offered back to the gateway first (`retry`), which may send the request to
another replica while nothing of the answer was passed on. An answer under way that breaks off,
or that the gateway ends (`cut`), closes the client's connection without the response's end, so
the client knows it is incomplete and can retry; an SSE stream first gets an error event in
sparkctl's envelope.

Nothing proxied lasts for good (`Bounds`): a request still going at its deadline is ended where it
is (a 504 while nothing of its answer went out, else its answer broken off), and one whose client
reads nothing for `client_pause` at a stretch is ended and its connection dropped, so a client that
stops reading cannot hold its engine's slot. Either way its engine's call is closed, which frees
its slot under the stack's cap, and the end is logged.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass

import structlog

from sparkctl.gateway.ledger import Ledger
from sparkctl.gateway.routes import Upstream
from sparkctl.gateway.server import Connection, envelope, error
from sparkctl.gateway.upstream import Call, Relay, UpstreamError

HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive"}
log = structlog.get_logger()


@dataclass(frozen=True)
class Bounds:
    """How long one proxied request may take, in seconds (the daemon passes its gateway settings)."""

    deadline: float = 1800.0  # from its arrival to its answer's end, whatever it waits for on the way
    client_pause: float = 60.0  # its client reading nothing (its socket full), at a stretch
    stall: float = 120.0  # a stream's engine sending nothing, its first token included
    first_byte: float = 600.0  # a whole (non-streamed) answer's engine sending nothing of it


class Proxied(Relay):
    """The upstream call's sink and the client connection's exchange, for one request."""

    def __init__(self, conn: Connection, path: str, payload: dict, *, ledger: Ledger,
                 done: Callable[[Proxied], None],
                 retry: Callable[[Proxied, UpstreamError], bool] = lambda *_: False, size: int = 0,
                 bounds: Bounds = Bounds()) -> None:
        self.conn, self.path, self.payload, self.size = conn, path, payload, size  # size: the body's bytes
        self.ledger, self.done, self.retry, self.bounds = ledger, done, retry, bounds
        self.model: str = payload["model"]  # as the client named it
        self.upstream: Upstream | None = None  # once routed
        self.replica: str | None = None  # the engine's URL, while forwarded to it
        self.tries = 0  # times sent to another replica after one failed
        self.task: asyncio.Task[None] | None = None  # while it waits at a hold or a cap
        self.call: Call | None = None  # once forwarded
        self.forwarded = self.started = self.over = self.sse = False
        self.since = time.monotonic()
        self.deadline = asyncio.get_running_loop().call_later(bounds.deadline, self._expire)
        self.pausing: asyncio.TimerHandle | None = None  # while its client reads nothing
        if conn.paused:  # an earlier answer on the connection is not read yet
            self.pause()

    def wait(self, step: Coroutine[None, None, None]) -> None:
        self.task = self.conn.task(step)

    # --- the upstream call's sink --------------------------------------------------------------
    def head(self, status: int, headers: list[tuple[str, str]], length: int | None) -> None:
        if status == 503 and self._elsewhere(UpstreamError("the engine answered 503 (asleep, or not serving now)",
                                                           unanswered=True)):
            return
        self.ledger.answered(self.upstream.stack, status)
        self.started = True
        kept = [(k, v) for k, v in headers if k.lower() not in HOP_HEADERS]
        self.sse = length is None and any(k.lower() == "content-type" and v.startswith("text/event-stream")
                                          for k, v in kept)
        self.conn.start(status, [*kept, ("X-Sparkctl-Stack", self.upstream.stack)], length)

    def body(self, piece: bytes, last: bool) -> None:
        if last:
            self._finish()
        self.conn.send(piece, last)

    def failed(self, e: UpstreamError) -> None:
        if e.stalled:
            log.warning("gateway_engine_silent", stack=self.upstream.stack, engine=self.replica, error=str(e),
                        started=self.started)
        if self._elsewhere(e):
            return  # on its way to another replica
        self._finish()
        if self.started:  # cut mid-answer
            self._break_off(str(e))
        else:
            stack = self.upstream.stack
            status, code = (504, "upstream_timeout") if e.stalled else (502, "upstream_unavailable")
            self.ledger.answered(stack, status)
            error(self.conn, status, f"stack {stack} did not answer ({e}); see `sparkctl status`", code)

    # --- the gateway's side --------------------------------------------------------------------
    def refuse(self, status: int, message: str, code: str, *, headers: Sequence[tuple[str, str]] = ()) -> None:
        """Answer an error of the gateway's own (no such model, a hold that gave up): the request is over."""
        self._finish()
        error(self.conn, status, message, code, headers=headers)

    def cut(self, why: str) -> None:
        """End an answer under way from an engine that left routing (its host is dead): the
        engine's connection closes, and the client's without the response's end."""
        if self.call is not None:
            self.call.cancel()
        self._finish()
        self._break_off(why)

    def _elsewhere(self, e: UpstreamError) -> bool:
        """Offer the failed engine back to the gateway; True if the request went to another replica
        (the engine's call, if still open, is closed: nothing more of it is wanted)."""
        call = self.call
        if not self.retry(self, e):
            return False
        if call is not None:
            call.cancel()
        return True

    def _break_off(self, why: str) -> None:
        """Close the client's connection without the response's end (the client sees an incomplete
        answer and may retry); an SSE stream first gets an error event, as the gateway's errors."""
        if self.sse:
            message = f"stack {self.upstream.stack}'s engine stopped mid-answer ({why}); retry the request"
            event = envelope(message, "upstream_unavailable")
            self.conn.send(b"\n\ndata: " + json.dumps(event).encode() + b"\n\n", False)
        self.conn.abort()

    def _expire(self) -> None:
        """Its deadline passed: ended where it is, a 504 while nothing of its answer went out."""
        why = (f"sparkctl ended the request at its deadline of {self.bounds.deadline:g} s "
               "(SPARKCTL_GATEWAY_REQUEST_DEADLINE)")
        self._end("deadline")
        if self.started:
            self._break_off(why)
            return
        if self.upstream is not None:
            self.ledger.answered(self.upstream.stack, 504)
        error(self.conn, 504, why, "deadline_exceeded")

    def _drop_client(self) -> None:
        """Its client read nothing for `client_pause`: ended, and its connection dropped at once with
        what is queued to it (a close would keep it open until the client read all of that)."""
        self.pausing = None
        self._end("client_pause")
        self.conn.abort()
        self.conn.transport.abort()

    def _end(self, bound: str) -> None:
        log.warning("gateway_request_ended", bound=bound, model=self.model,
                    stack=self.upstream.stack if self.upstream else None, started=self.started,
                    after_s=round(time.monotonic() - self.since, 3))
        self.cancel()

    # --- the client connection's exchange --------------------------------------------------------
    def cancel(self) -> None:
        """The client went away: stop waiting, or close the engine's connection so it stops."""
        if self.task is not None:
            self.task.cancel()
        if self.call is not None:
            self.call.cancel()
        self._finish()

    def pause(self) -> None:
        """The client's socket is full: the engine's is read no further, for `client_pause` at most."""
        super().pause()
        if self.pausing is None and not self.over:
            self.pausing = asyncio.get_running_loop().call_later(self.bounds.client_pause, self._drop_client)

    def resume(self) -> None:
        super().resume()
        self._unpause()

    def _unpause(self) -> None:
        if self.pausing is not None:
            self.pausing.cancel()
            self.pausing = None

    def _finish(self) -> None:
        if not self.over and self.upstream is not None:
            self.done(self)
        self.over = True
        self.deadline.cancel()
        self._unpause()
