"""Per-stack serialisation, in one place: a stack's (or an alias's) actions take turns in the
order they were asked for. The API takes a ticket when a request arrives, on the event loop, and
its worker thread waits for that ticket's turn; the reconciler's actions and the switch take
theirs when they start. A thread that already holds a key's turn passes through (an `up` holds
its stack's turn across the desired-state change and the deploy). A ticket withdrawn before its
turn (a refused request, a cancelled action) leaves the queue: it never gets its turn, and the
tickets behind it move up."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

from sparkctl.errors import SparkctlError


class Withdrawn(SparkctlError):
    """A ticket's waiter learns that its ticket left the queue before its turn: its action never ran."""


class Turns:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._issued: defaultdict[str, int] = defaultdict(int)  # next ticket per key
        self._serving: defaultdict[str, int] = defaultdict(int)  # the ticket whose turn it is
        self._holder: dict[str, tuple[int, int]] = {}  # key -> (thread id, depth)
        self._withdrawn: defaultdict[str, set[int]] = defaultdict(set)  # tickets behind the served one

    def ticket(self, key: str) -> int:
        """A place in `key`'s queue, taken now (it never waits)."""
        with self._changed:
            self._issued[key] += 1
            return self._issued[key] - 1

    @contextmanager
    def turn(self, key: str, ticket: int | None = None) -> Iterator[None]:
        """Wait for `ticket`'s turn (a new ticket if none), hold it, then let the next one go.
        `Withdrawn` if the ticket left the queue first."""
        me = threading.get_ident()
        with self._changed:
            holder = self._holder.get(key)
            if holder and holder[0] == me:
                self._holder[key] = (me, holder[1] + 1)
            else:
                if ticket is None:
                    self._issued[key] += 1
                    ticket = self._issued[key] - 1
                self._changed.wait_for(lambda: self._serving[key] >= ticket or ticket in self._withdrawn[key])
                if self._serving[key] != ticket:  # passed over, or still ahead but withdrawn
                    raise Withdrawn("cancelled before its turn: it did not run")
                self._holder[key] = (me, 1)
        try:
            yield
        finally:
            with self._changed:
                thread, depth = self._holder[key]
                if depth > 1:
                    self._holder[key] = (thread, depth - 1)
                else:
                    del self._holder[key]
                    self._pass(key)

    def waiting(self, key: str, ticket: int) -> bool:
        """Whether `ticket` waits for an earlier one's turn to end."""
        with self._changed:
            return ticket > self._serving[key] and ticket not in self._withdrawn[key]

    def withdraw(self, key: str, ticket: int) -> bool:
        """Take `ticket` out of `key`'s queue before its turn (its request was refused, or its
        action cancelled): it never gets a turn, its waiter (now or later) raises `Withdrawn`, and
        the tickets behind it move up. False when its turn is taken or over: it runs or ran."""
        with self._changed:
            serving = self._serving[key]
            if not serving <= ticket < self._issued[key] or ticket in self._withdrawn[key]:
                return False
            if ticket > serving:
                self._withdrawn[key].add(ticket)
                self._changed.notify_all()
            elif key in self._holder:  # its turn has come and is taken
                return False
            else:  # its turn has come, and no thread took it yet
                self._pass(key)
            return True

    def _pass(self, key: str) -> None:
        """The turn goes to the next ticket still in the queue (the lock is held)."""
        self._serving[key] += 1
        while self._serving[key] in self._withdrawn[key]:
            self._withdrawn[key].discard(self._serving[key])
            self._serving[key] += 1
        self._changed.notify_all()
