"""The daemon's event log: what happened, in order, for the API's streaming endpoint and the
CLI's progress. Thread-safe; readers wait for events after a sequence number."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any


class EventBus:
    def __init__(self, keep: int = 2000) -> None:
        self._events: deque[dict[str, Any]] = deque(maxlen=keep)
        self._seq = 0
        self._changed = threading.Condition()

    def publish(self, kind: str, **fields: Any) -> dict[str, Any]:
        with self._changed:
            self._seq += 1
            event = {"seq": self._seq, "time": time.time(), "kind": kind, **fields}
            self._events.append(event)
            self._changed.notify_all()
        return event

    @property
    def last(self) -> int:
        return self._seq

    def after(self, seq: int, *, timeout: float) -> list[dict[str, Any]]:
        """Events newer than `seq`, waiting up to `timeout` seconds for one to arrive."""
        with self._changed:
            self._changed.wait_for(lambda: self._seq > seq, timeout=timeout)
            return [e for e in self._events if e["seq"] > seq]


class BusReporter:
    """The deploy pipeline's reporter, publishing to the bus (progress is thinned)."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self._last_progress: dict[tuple[str, str], float] = {}

    def phase(self, stack: str, phase: Any, detail: str = "") -> None:
        self.bus.publish("phase", stack=stack, phase=str(phase), detail=detail)

    def progress(self, stack: str, task: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._last_progress.get((stack, task), 0.0) < 0.5:
            return
        self._last_progress[(stack, task)] = now
        self.bus.publish("progress", stack=stack, task=task, done=done, total=total)

    def note(self, stack: str, text: str) -> None:
        self.bus.publish("note", stack=stack, text=text)
