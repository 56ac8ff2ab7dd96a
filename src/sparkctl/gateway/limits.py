"""What all client connections of one gateway server share: a cap on how many are open, a budget
for the request-body bytes held at once across them, how long a request may take to arrive, and
the switch that starts a graceful stop.

At the cap, a new connection takes the place of the one idle the longest (answering nothing, its
next request's head not in: one that never sent a request, or a keep-alive connection between
requests), which is closed: idle connections cannot lock everyone out. When none is idle, up to
`reserve` more are let in for `/health` and the owner only (`server.py` judges each request).

Built once by whoever starts the server (the daemon, sized to its file descriptors) and handed to
every `Connection`, which counts itself in and out and charges the bytes it reads; the daemon
reads the refusals back to log them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparkctl.gateway.server import Connection


@dataclass
class Limits:
    """What all connections of one server share: how many may be open, and how many bytes of
    request bodies may be held at once. A refusal is counted, and `refused` reports it (the
    gateway logs it at most once per interval)."""

    connections: int = 4096
    body_bytes: int = 256 * 1024 * 1024
    upload_time: float = 60.0  # seconds a request may take to arrive, from its first byte (then a 408)
    reserve: int = 16  # connections past the cap, while none is idle, for /health and the owner
    held: int = 0
    refused: int = 0
    last_report: float = field(default=0.0)
    live: set[Connection] = field(default_factory=set)  # open connections
    idle: dict[Connection, None] = field(default_factory=dict)  # those answering nothing, longest idle first
    finishing: bool = False  # a graceful stop began: connections close after their next answer
    none_open: asyncio.Event = field(default_factory=asyncio.Event)  # set while `live` is empty

    def __post_init__(self) -> None:
        self.none_open.set()

    @property
    def open(self) -> int:
        return len(self.live)

    def enter(self, conn: Connection) -> None:
        self.live.add(conn)
        self.none_open.clear()

    def leave(self, conn: Connection) -> None:
        self.live.discard(conn)
        self.idle.pop(conn, None)
        if not self.live:
            self.none_open.set()

    def rest(self, conn: Connection) -> None:
        """`conn` answers nothing now, and waits for a request."""
        self.idle.pop(conn, None)
        self.idle[conn] = None

    def busy(self, conn: Connection) -> None:
        self.idle.pop(conn, None)

    def make_room(self) -> bool:
        """At the cap: close the connection idle the longest (at once: its file descriptor is what
        the cap guards); False when none is idle."""
        oldest = next(iter(self.idle), None)
        if oldest is None:
            return False
        oldest.close(now=True)
        self.leave(oldest)
        return True

    def finish(self) -> None:
        """A graceful stop: every connection closes once the response it is giving is complete
        (an idle one at once), so a client's next request opens a new connection."""
        self.finishing = True
        for conn in list(self.live):
            conn.finish()

    def report_due(self) -> int:
        """Refusals since the last report, when one is due (else 0)."""
        now = time.monotonic()
        if not self.refused or now - self.last_report < 10.0:
            return 0
        count, self.refused, self.last_report = self.refused, 0, now
        return count
