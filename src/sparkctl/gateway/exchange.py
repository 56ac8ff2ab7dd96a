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
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine

from sparkctl.gateway.ledger import Ledger
from sparkctl.gateway.routes import Upstream
from sparkctl.gateway.server import Connection, envelope, error
from sparkctl.gateway.upstream import Call, Relay, UpstreamError

HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive"}


class Proxied(Relay):
    """The upstream call's sink and the client connection's exchange, for one request."""

    def __init__(self, conn: Connection, path: str, payload: dict, *, ledger: Ledger,
                 done: Callable[[Proxied], None],
                 retry: Callable[[Proxied, UpstreamError], bool] = lambda *_: False, size: int = 0) -> None:
        self.conn, self.path, self.payload, self.size = conn, path, payload, size  # size: the body's bytes
        self.ledger, self.done, self.retry = ledger, done, retry
        self.model: str = payload["model"]  # as the client named it
        self.upstream: Upstream | None = None  # once routed
        self.replica: str | None = None  # the engine's URL, while forwarded to it
        self.tries = 0  # times sent to another replica after one failed
        self.task: asyncio.Task[None] | None = None  # while it waits at a hold or a cap
        self.call: Call | None = None  # once forwarded
        self.forwarded = self.started = self.over = self.sse = False

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
        if self._elsewhere(e):
            return  # on its way to another replica
        self._finish()
        if self.started:  # cut mid-answer
            self._break_off(str(e))
        else:
            stack = self.upstream.stack
            self.ledger.answered(stack, 502)
            error(self.conn, 502, f"stack {stack} did not answer ({e}); see `sparkctl status`", "upstream_unavailable")

    # --- the gateway's side --------------------------------------------------------------------
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

    # --- the client connection's exchange --------------------------------------------------------
    def cancel(self) -> None:
        """The client went away: stop waiting, or close the engine's connection so it stops."""
        if self.task is not None:
            self.task.cancel()
        if self.call is not None:
            self.call.cancel()
        self._finish()

    def _finish(self) -> None:
        if not self.over and self.upstream is not None:
            self.done(self)
        self.over = True
