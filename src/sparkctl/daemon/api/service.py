"""The API's two faces, as its handlers see them: `Commands` (the actions, `daemon/actions/`) and
`Queries` (the read model, `daemon/reads.py`), held by the app under COMMANDS and QUERIES; and
the count of log follows open (`Gauge`, under FOLLOWS), one for every listener of the API."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from sparkctl import messages
from sparkctl.daemon.events import EventBus
from sparkctl.daemon.turns import Turns
from sparkctl.state.desired import Desired

if TYPE_CHECKING:
    from sparkctl.daemon.actions import Aliases, Benchmarks, Deploys, ImageBook, Parking, PatchChecks, Trials
    from sparkctl.daemon.actions.machines import Fleet


class Commands(Protocol):
    """The actions (`daemon/actions/`), each a coroutine run in the turn of the ticket its request
    took as it arrived."""

    @property
    def bus(self) -> EventBus: ...

    @property
    def turns(self) -> Turns: ...

    @property
    def deploys(self) -> Deploys: ...

    @property
    def parking(self) -> Parking: ...

    @property
    def aliases(self) -> Aliases: ...

    @property
    def trials(self) -> Trials: ...

    @property
    def bench(self) -> Benchmarks: ...

    @property
    def patches(self) -> PatchChecks: ...

    @property
    def images(self) -> ImageBook: ...

    @property
    def fleet(self) -> Fleet | None: ...


class Queries(Protocol):
    """What the daemon answers without changing anything (`daemon/reads.py`), on a worker (`seam.blocking`)."""

    def check_stack(self, name: str) -> str: ...

    def desired(self) -> Desired: ...

    def status(self) -> messages.Status: ...

    def stacks(self) -> tuple[messages.StackRow, ...]: ...

    def history(self, stack: str | None) -> messages.History: ...

    def metrics_text(self) -> str: ...

    def logs(self, stack: str, tail: int) -> AsyncIterator[bytes]: ...

    def runs(self) -> tuple[messages.RunRow, ...]: ...

    def series(self) -> messages.Series: ...

    def chart(self, name: str) -> str: ...

    def reports(self) -> tuple[messages.ReportRow, ...]: ...

    def report_file(self, report: str, path: str) -> Path: ...


MAX_FOLLOWS = 32  # log follows open at once, in all: each holds a connection to Docker and two sockets


class Gauge:
    """The long-lived reads open at once, up to `limit`; counted on the loop only."""

    def __init__(self, limit: int = MAX_FOLLOWS) -> None:
        self.limit, self.open = limit, 0

    @contextmanager
    def held(self) -> Iterator[None]:
        """One more open for the block's length; a 503 when `limit` are open already."""
        if self.open >= self.limit:
            raise web.HTTPServiceUnavailable(content_type="application/json", headers={"Retry-After": "5"},
                                             text=json.dumps({"error": {
                                                 "message": f"{self.open} log follows are open, the most the daemon "
                                                            "serves at once: close one, or read without following",
                                                 "type": "too_many_follows"}}))
        self.open += 1
        try:
            yield
        finally:
            self.open -= 1


COMMANDS = web.AppKey("commands", Commands)
QUERIES = web.AppKey("queries", Queries)
CLOSING = web.AppKey("closing", asyncio.Event)  # set as the API stops: the long-lived streams end
FOLLOWS = web.AppKey("follows", Gauge)  # the log follows open, on every listener of the API
