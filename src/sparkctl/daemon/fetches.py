"""The fetches under way (a deploy's, a pull's or a patch check's) and benchmarks running, each
with the `stop` that ends its streams (llama-benchy's at its next request): a `down` of the stack
stops it before waiting for its turn, and the daemon's stop ends them all. A cancel names its
action instead, and sets that action's own `stop`."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Fetches:
    def __init__(self) -> None:
        self._stops: dict[str, threading.Event] = {}  # stack -> its fetch's stop, while one runs
        self.stopping = False  # the daemon stops (`stop_all`)

    @contextmanager
    def running(self, stack: str, stop: threading.Event | None = None) -> Iterator[threading.Event]:
        """The stack's fetch for the block's length, stopped by `stop` (a new one if none)."""
        self._stops[stack] = stop = stop or threading.Event()
        try:
            yield stop
        finally:
            self._stops.pop(stack, None)

    def stop(self, stack: str) -> bool:
        """End the fetch streams of the stack's deploy (or pull) under way: its turn ends soon
        after, not once every byte has arrived. False: none runs."""
        if (fetching := self._stops.get(stack)) is not None:
            fetching.set()
        return fetching is not None

    def stop_all(self) -> None:
        """The daemon's stop: every fetch under way ends (a deploy fetching would hold the stop up
        until it ends), and an `up` it stops keeps its stack desired: the next daemon resumes it."""
        self.stopping = True
        for stack in list(self._stops):
            self.stop(stack)
