"""The daemon's event log: what happened, in order, for the API's streaming endpoint and the
CLI's progress. Events are the typed records of `sparkctl.messages`; each names the stack (or
alias) it is about, so a stream shows only what its request started. Kept on the daemon's loop:
a publish from a worker (the pipeline's progress, a benchmark's note, the fleet watch) crosses
there through the seam. Readers wait for events after a sequence number and get them in their
wire form (a dict with seq, time, kind)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import asdict
from typing import Any

from sparkctl.daemon.seam import to_loop
from sparkctl.messages import Event, Note, PhaseChanged, Progress


class EventBus:
    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop  # the daemon's (None: whoever publishes, on their own thread)
        self._events: deque[dict[str, Any]] = deque(maxlen=2000)
        self._seq = 0
        self._arrived = asyncio.Event()  # set (and replaced) at each publish

    def publish(self, event: Event) -> None:
        """From the loop, or from a worker (then it lands in call order, soon)."""
        to_loop(self.loop, self._append, event)

    def _append(self, event: Event) -> None:
        self._seq += 1
        self._events.append({"seq": self._seq, "time": time.time(), "kind": event.kind, **asdict(event)})
        arrived, self._arrived = self._arrived, asyncio.Event()
        arrived.set()

    @property
    def last(self) -> int:
        return self._seq

    async def wait_after(self, seq: int, *, timeout: float) -> list[dict[str, Any]]:
        """Events newer than `seq`, waiting up to `timeout` seconds for one to arrive."""
        if self._seq <= seq and timeout > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout)
        return [e for e in self._events if e["seq"] > seq]


class BusReporter:
    """The deploy pipeline's reporter, publishing to the bus (progress is thinned)."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self._last_progress: dict[tuple[str, str], float] = {}

    def phase(self, stack: str, phase: Any, detail: str = "") -> None:
        self.bus.publish(PhaseChanged(stack, str(phase), detail))

    def progress(self, stack: str, task: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._last_progress.get((stack, task), 0.0) < 0.5:
            return
        self._last_progress[(stack, task)] = now
        self.bus.publish(Progress(stack, task, done, total))

    def note(self, stack: str, text: str) -> None:
        self.bus.publish(Note(stack, text))
