"""The daemon's event log: what happened, in order, for the API's streaming endpoint and the
CLI's progress. Events are the typed records of `sparkctl.messages`; each names the stack (or
alias) it is about, so a stream shows only what its request started. Thread-safe; readers wait
for events after a sequence number and get them in their wire form (a dict with seq, time,
kind)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from sparkctl.messages import Event, Note, PhaseChanged, Progress


class EventBus:
    """Published to from any thread; read by threads (`after`) or by coroutines (`wait_after`,
    which parks no thread while it waits)."""

    def __init__(self) -> None:
        self._events: deque[dict[str, Any]] = deque(maxlen=2000)
        self._seq = 0
        self._changed = threading.Condition()
        self._waiters: set[Callable[[], None]] = set()  # coroutines' wake-ups

    def publish(self, event: Event) -> dict[str, Any]:
        with self._changed:
            self._seq += 1
            record = {"seq": self._seq, "time": time.time(), "kind": event.kind, **asdict(event)}
            self._events.append(record)
            self._changed.notify_all()
            for wake in self._waiters:
                wake()
        return record

    @property
    def last(self) -> int:
        return self._seq

    def after(self, seq: int, *, timeout: float) -> list[dict[str, Any]]:
        """Events newer than `seq`, waiting up to `timeout` seconds for one to arrive."""
        with self._changed:
            self._changed.wait_for(lambda: self._seq > seq, timeout=timeout)
            return [e for e in self._events if e["seq"] > seq]

    async def wait_after(self, seq: int, *, timeout: float) -> list[dict[str, Any]]:
        """`after`, for a coroutine on an event loop."""
        loop, woken = asyncio.get_running_loop(), asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(woken.set)

        with self._changed:
            if self._seq > seq or timeout <= 0:
                return [e for e in self._events if e["seq"] > seq]
            self._waiters.add(wake)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), timeout)
        finally:
            with self._changed:
                self._waiters.discard(wake)
        return self.after(seq, timeout=0)


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
