"""The daemon's loops stop when asked, whatever they were doing: on Python 3.11 a cancel that
meets a just-set kick inside `asyncio.wait_for` is swallowed, and a daemon that did not stop on
SIGTERM was the symptom."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from sparkctl.daemon.loops import Loops


class Stream:
    """A Docker event stream with no events: blocks until closed."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> dict:
        self.closed.wait()
        raise StopIteration

    def close(self) -> None:
        self.closed.set()


@pytest.mark.parametrize("turns", range(6))
def test_the_loops_stop_even_when_a_kick_lands_with_the_cancel(turns: int) -> None:
    async def scenario() -> None:
        reconciler = SimpleNamespace(wake_at=None, reconcile=lambda: None)
        docker = SimpleNamespace(events=Stream)
        loops = Loops(reconciler=reconciler, docker=docker, store=None, instance="default", resync=3600,
                      after_pass=lambda: None)
        loops.start()
        await asyncio.sleep(0.05)  # both loops wait: for a kick, for the next event
        loops.kick()
        for _ in range(turns):  # the kick's wake-up travels through wait_for meanwhile
            await asyncio.sleep(0)
        await asyncio.wait_for(loops.stop(), timeout=5)

    asyncio.run(scenario())
