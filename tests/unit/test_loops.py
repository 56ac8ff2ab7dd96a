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
        self.waiting = threading.Event()

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> dict:
        self.waiting.set()
        self.closed.wait(30)  # closed by `Loops.stop`; bounded so a loop that never stops fails, not hangs
        raise StopIteration

    def close(self) -> None:
        self.closed.set()


class Reconciler:
    """Counts the loop's reads of `wake_at`: the second comes after the first pass, as it waits again."""

    def __init__(self) -> None:
        self.asked = 0

    @property
    def wake_at(self) -> None:
        self.asked += 1

    async def reconcile(self) -> None:
        pass


@pytest.mark.parametrize("turns", range(6))
def test_the_loops_stop_even_when_a_kick_lands_with_the_cancel(turns: int) -> None:
    async def scenario() -> None:
        reconciler, streams = Reconciler(), []
        docker = SimpleNamespace(events=lambda: streams.append(Stream()) or streams[-1])
        loops = Loops(reconciler=reconciler, docker=docker, store=None, instance="default", resync=3600,
                      after_pass=lambda: asyncio.sleep(0))
        async def both_wait() -> None:  # for a kick, for the next event
            while not (reconciler.asked >= 2 and streams and streams[0].waiting.is_set()):
                await asyncio.sleep(0.001)

        loops.start()
        await asyncio.wait_for(both_wait(), timeout=10)
        loops.kick()
        for _ in range(turns):  # the kick's wake-up travels through wait_for meanwhile
            await asyncio.sleep(0)
        await asyncio.wait_for(loops.stop(), timeout=5)

    asyncio.run(scenario())
