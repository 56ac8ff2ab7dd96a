"""The daemon's two loops, as tasks on its event loop: the reconcile loop (a pass when kicked,
when a backoff ends, and every resync interval) and the Docker event watcher (deaths and OOM
kills of this instance's containers; reconnects with backoff, and resyncs after). A pass is a
coroutine; the wait for the next Docker event is blocking, on a worker through the seam. Built
and started by `daemon/app.py`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import structlog

from sparkctl import instance as instances
from sparkctl.adapters.docker import DockerEngine, Events
from sparkctl.container import Event
from sparkctl.daemon import process
from sparkctl.daemon.reconciler import Reconciler
from sparkctl.daemon.seam import blocking
from sparkctl.state.store import Store

log = structlog.get_logger()


class Loops:
    def __init__(self, *, reconciler: Reconciler, docker: DockerEngine, store: Store, instance: str,
                 resync: float, after_pass: Callable[[], Awaitable[None]]) -> None:
        self.reconciler, self.docker, self.store, self.instance = reconciler, docker, store, instance
        self.resync, self.after_pass = resync, after_pass  # after a pass: rebuild the gateway's routes
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._oom: set[str] = set()
        self._events_stream: Events | None = None  # the open Docker event stream, closed on shutdown
        self._stopping = False

    def kick(self) -> None:
        """Ask for a pass now (before the loops run, the first pass comes anyway)."""
        self._kick.set()

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self.watch_events()), asyncio.create_task(self.reconcile_forever())]

    async def stop(self) -> None:
        # The flag, not only the cancel: on Python 3.11 `wait_for` returns instead of raising when
        # its cancel meets an awaited event that was just set (a kick), and the loop would go on.
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        if self._events_stream is not None:
            self._events_stream.close()  # ends the worker thread's wait for the next event
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def reconcile_forever(self) -> None:
        while not self._stopping:
            wake = self.reconciler.wake_at
            timeout = self.resync if wake is None else max(0.0, min(self.resync, wake - time.time()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout)
            if self._stopping:  # a swallowed cancel (see `stop`): no pass after the stop
                break
            self._kick.clear()
            try:
                await self._pass()
            except Exception as e:  # noqa: BLE001 - the loop must outlive any one bad pass
                log.error("reconcile_failed", error=f"{type(e).__name__}: {e}".splitlines()[0][:300])
                await asyncio.sleep(1.0)
                self._kick.set()  # try again: the resync must not wait a whole interval after a failure

    async def _pass(self) -> None:
        try:
            await self.reconciler.reconcile()
            await self.after_pass()
        finally:
            await blocking(process.give_back_memory)

    async def watch_events(self) -> None:
        """Docker events (die, oom, start, destroy) of our containers; reconnects with backoff."""
        delay = 0.5
        while not self._stopping:
            try:
                self._events_stream = stream = await blocking(self.docker.events)
                log.info("docker_events_connected")
                delay = 0.5
                self._kick.set()  # resync: events may have been missed while disconnected
                while (event := await blocking(next, stream, None)) is not None:
                    await self.on_event(event)
                raise ConnectionError("the event stream ended")
            except Exception as e:  # noqa: BLE001 - the engine went away: back off and reconnect
                log.warning("docker_events_lost", error=f"{type(e).__name__}: {e}"[:200], retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def on_event(self, event: Event) -> None:
        """One Docker event: a death counts towards the crash-loop rule; any change asks for a pass."""
        if not instances.owned(event.labels, self.instance):
            return  # another instance's container: its own daemon handles it
        if event.action == "oom":
            self._oom.add(event.container)
        elif event.action == "die" and event.stack:
            oom = event.container in self._oom
            self._oom.discard(event.container)
            died = await self.reconciler.died(event.stack, oom=oom, exit_code=event.exit_code)
            self.kick()  # the pass counts the death at once; its record may land after
            if died:
                await blocking(self.store.events.record, event.stack, "died",
                               "OOM-killed" if oom else f"exit code {event.exit_code}")
        elif event.action in ("destroy", "stop"):
            self.kick()
