"""Per-stack serialisation, in one place: a stack's (or an alias's) actions take turns in the
order they were asked for. The API takes a ticket when a request arrives, on the event loop, and
its worker thread waits for that ticket's turn; the reconciler's actions and the switch take
theirs when they start. A thread that already holds a key's turn passes through (an `up` holds
its stack's turn across the desired-state change and the deploy)."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager


class Turns:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._issued: defaultdict[str, int] = defaultdict(int)  # next ticket per key
        self._serving: defaultdict[str, int] = defaultdict(int)  # the ticket whose turn it is
        self._holder: dict[str, tuple[int, int]] = {}  # key -> (thread id, depth)

    def ticket(self, key: str) -> int:
        """A place in `key`'s queue, taken now (it never waits)."""
        with self._changed:
            self._issued[key] += 1
            return self._issued[key] - 1

    @contextmanager
    def turn(self, key: str, ticket: int | None = None) -> Iterator[None]:
        """Wait for `ticket`'s turn (a new ticket if none), hold it, then let the next one go."""
        me = threading.get_ident()
        with self._changed:
            holder = self._holder.get(key)
            if holder and holder[0] == me:
                self._holder[key] = (me, holder[1] + 1)
                ticket = None
            else:
                if ticket is None:
                    self._issued[key] += 1
                    ticket = self._issued[key] - 1
                self._changed.wait_for(lambda: self._serving[key] == ticket)
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
                    self._serving[key] += 1
                    self._changed.notify_all()

    def skip(self, key: str, ticket: int) -> None:
        """Pass a ticket's turn on unused (its request was refused)."""
        with self.turn(key, ticket):
            pass
