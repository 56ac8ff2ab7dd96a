"""Per-stack serialisation, in one place: a stack's (or an alias's) actions take turns in the
order they were asked for. The API takes a ticket when a request arrives, and its action waits
for that ticket's turn; the reconciler's actions and the switch's steps take theirs when they
start. Turns are taken at one layer only (the action, never again inside it), on the daemon's
loop. A ticket withdrawn before its turn (a refused request, a cancelled action) leaves the
queue: it never gets its turn, and the tickets behind it move up."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sparkctl.errors import SparkctlError


class Withdrawn(SparkctlError):
    """A ticket's waiter learns that its ticket left the queue before its turn: its action never ran."""


class Turns:
    def __init__(self) -> None:
        self._issued: defaultdict[str, int] = defaultdict(int)  # next ticket per key
        self._serving: defaultdict[str, int] = defaultdict(int)  # the ticket whose turn it is
        self._held: set[str] = set()  # keys whose turn is taken
        self._withdrawn: defaultdict[str, set[int]] = defaultdict(set)  # tickets behind the served one
        self._moved: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)  # set as a key's queue moves

    def ticket(self, key: str) -> int:
        """A place in `key`'s queue, taken now (it never waits)."""
        self._issued[key] += 1
        return self._issued[key] - 1

    @asynccontextmanager
    async def turn(self, key: str, ticket: int | None = None) -> AsyncIterator[None]:
        """Wait for `ticket`'s turn (a new ticket if none), hold it, then let the next one go.
        `Withdrawn` if the ticket left the queue first; a waiter cancelled leaves it too."""
        ticket = self.ticket(key) if ticket is None else ticket
        try:
            while self._serving[key] < ticket and ticket not in self._withdrawn[key]:
                await self._moved[key].wait()
        except asyncio.CancelledError:
            self.withdraw(key, ticket)
            raise
        if self._serving[key] != ticket:  # passed over, or still ahead but withdrawn
            raise Withdrawn("cancelled before its turn: it did not run")
        self._held.add(key)
        try:
            yield
        finally:
            self._held.discard(key)
            self._pass(key)

    def waiting(self, key: str, ticket: int) -> bool:
        """Whether `ticket` waits for an earlier one's turn to end."""
        return ticket > self._serving[key] and ticket not in self._withdrawn[key]

    def withdraw(self, key: str, ticket: int) -> bool:
        """Take `ticket` out of `key`'s queue before its turn (its request was refused, or its
        action cancelled): it never gets a turn, its waiter (now or later) raises `Withdrawn`, and
        the tickets behind it move up. False when its turn is taken or over: it runs or ran."""
        serving = self._serving[key]
        if not serving <= ticket < self._issued[key] or ticket in self._withdrawn[key]:
            return False
        if ticket > serving:
            self._withdrawn[key].add(ticket)
            self._wake(key)
        elif key in self._held:  # its turn has come and is taken
            return False
        else:  # its turn has come, and no one took it yet
            self._pass(key)
        return True

    def _pass(self, key: str) -> None:
        """The turn goes to the next ticket still in the queue."""
        self._serving[key] += 1
        while self._serving[key] in self._withdrawn[key]:
            self._withdrawn[key].discard(self._serving[key])
            self._serving[key] += 1
        self._wake(key)

    def _wake(self, key: str) -> None:
        self._moved.pop(key, asyncio.Event()).set()  # every waiter looks again, at a new event
