"""Another server's answer passed on to a client as it arrives: the daemon's API to the dashboard's
browser (`ui.py`), a host's engine to the head's gateway (`relay.py`).

A `Passed` is both the upstream call's sink and the client connection's exchange: the answer's
head and body go to the client as they come, flow control goes back to the call, and a client
that leaves ends the call. What a client gets when the server did not answer at all is the
caller's to say (`unanswered`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sparkctl.gateway.exchange import HOP_HEADERS
from sparkctl.gateway.server import Connection
from sparkctl.gateway.upstream import Call, Relay, UpstreamError


class Passed(Relay):
    def __init__(self, conn: Connection, unanswered: Callable[[Connection, UpstreamError], None],
                 headers: Sequence[tuple[str, str]] = ()) -> None:
        self.conn, self.unanswered, self.headers, self.started = conn, unanswered, list(headers), False
        self.call: Call | None = None

    def head(self, status: int, headers: list[tuple[str, str]], length: int | None) -> None:
        self.started = True
        kept = [(k, v) for k, v in headers if k.lower() not in HOP_HEADERS]
        self.conn.start(status, [*kept, *self.headers], length)

    def body(self, piece: bytes, last: bool) -> None:
        self.conn.send(piece, last)

    def failed(self, e: UpstreamError) -> None:
        if self.started:
            self.conn.abort()
        else:
            self.unanswered(self.conn, e)

    def cancel(self) -> None:
        if self.call is not None:
            self.call.cancel()
