"""The wake watchdog: while a parked stack wakes, the memory still available (MemAvailable and
the kernel's per-CPU free lists, `deploy.memory.available`) is read every 50 ms, and the moment
it falls under the floor `breach` runs once (the caller kills the waking engine). On a Spark a
wake that exhausts unified memory can freeze the whole host (vLLM #50011); a killed engine only
has to start again."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType

import structlog

from sparkctl.deploy.memory import available

log = structlog.get_logger()

EVERY = 0.05  # seconds between two reads (one costs well under a millisecond)


class MemoryWatch:
    def __init__(self, floor: int, breach: Callable[[int], None], *, every: float = EVERY,
                 available: Callable[[], int] = available) -> None:
        self.floor, self.breach, self.every, self.available = floor, breach, every, available
        self.tripped: int | None = None  # what was available when the floor was crossed
        self.lowest: int | None = None  # the least seen available
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="wake-watchdog", daemon=True)

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while True:
            try:
                now = self.available()
                self.lowest = now if self.lowest is None else min(self.lowest, now)
                if now < self.floor:
                    self.breach(now)
                    self.tripped = now
                    return
            except Exception as e:  # noqa: BLE001 - say so: the wake goes on unwatched
                log.error("wake_watchdog_failed", error=f"{type(e).__name__}: {e}"[:300])
                return
            if self._done.wait(self.every):
                return
