"""Parking on real adapters: a stack's engine put to sleep with vLLM's sleep mode (or stopped),
recorded in desired.yaml, woken under the wake watchdog, or stopped at once by the sentinel. The
one maker of sleep-mode clients (`adapters/sleepmode.py`). Its caller holds the stack's turn;
all but `park` are blocking (called through the seam).

The wake watchdog (`MemoryWatch`): while a parked stack wakes, the memory still available
(MemAvailable and the kernel's per-CPU free lists, `deploy.memory.available`) is read every 50 ms,
and the moment it falls under the floor the waking engine is killed. On a Spark a wake that
exhausts unified memory can freeze the whole host (vLLM #50011); a killed engine only has to
start again."""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from types import TracebackType

import structlog

from sparkctl.adapters.docker import DockerEngine
from sparkctl.adapters.sleepmode import SleepMode
from sparkctl.daemon.machine import DockerMachine
from sparkctl.daemon.seam import blocking
from sparkctl.deploy.memory import GIB, available
from sparkctl.errors import SparkctlError
from sparkctl.messages import WakeDone
from sparkctl.spec.load import Catalog
from sparkctl.state.desired import DesiredFile
from sparkctl.state.store import Store

log = structlog.get_logger()


class Sleeper:
    def __init__(self, *, machine: DockerMachine, docker: DockerEngine, catalog: Callable[[], Catalog],
                 desired: DesiredFile, store: Store, wake_floor: int = 0) -> None:
        self.machine, self.docker, self.catalog, self.desired = machine, docker, catalog, desired
        self.store = store
        self.wake_floor = wake_floor  # bytes of MemAvailable under which a wake is killed

    def sleeping(self, stack: str) -> bool:
        """Whether the stack's engine says it sleeps (`GET /is_sleeping`)."""
        return self._engine(stack).sleeping()

    def available(self, stack: str) -> bool:
        """Whether the stack's engine has the sleep-mode endpoints."""
        return self._engine(stack).available()

    async def park(self, stack: str, level: int, *, before: Callable[[], Awaitable[None]] | None = None) -> None:
        """Asleep at `level` 1 or 2 (the container keeps running), or stopped (0). Recorded in
        desired.yaml before the engine is asked (a daemon killed meanwhile parks it again), then
        `before` runs (the gateway lets go of it); if the engine refuses, the record is undone."""
        await blocking(self.desired.update, lambda d: d.park(stack, level))
        try:
            if before is not None:
                await before()
            await blocking(self._engine(stack).sleep, level) if level else await blocking(self.machine.stop, stack)
        except SparkctlError:
            await blocking(self.desired.update, lambda d: d.awake(stack))
            raise
        await blocking(self.store.events.record, stack, "parked", f"level {level}" if level else "stopped")

    def halt(self, stack: str, why: str) -> list[str]:
        """Stop the stack's engine at once (killed), outside its turn: the sentinel's stop when the
        host is at risk, and what holds the turn (a deploy's startup, a wake) may be what grows.
        Recorded parked (stopped) first, so the reconciler leaves it and its death is no crash; a
        request wakes it again once the gateway admits them."""
        self.desired.update(lambda d: d.park(stack, 0))
        running = [c.id for c in self.docker.containers(stack) if c.running and not c.placed]
        for container in running:
            self.docker.kill(container)
        self.store.events.record(stack, "parked", f"stopped by the sentinel: {why}")
        return running

    def wake(self, stack: str) -> WakeDone:
        """Wake a parked stack and warm it up with one token, under the wake watchdog. A wake that
        fails, or brings MemAvailable under the floor, is killed at once and the stack started
        cold instead; so is one whose engine died while it slept."""
        level = self.desired.read().parked.get(stack, 0)
        [container] = [c.id for c in self.docker.containers(stack)][:1] or [None]
        if container is None:
            raise SparkctlError(f"{stack} is parked but has no container; `sparkctl up {stack}` deploys it again")
        killed, lowest, began = None, None, time.monotonic()
        asleep = level and self.docker.inspect(container).status == "running"
        if asleep:
            killed, lowest = self._wake_watched(stack, container, level)
        if not asleep or killed:
            self.machine.start(container)
        self.desired.update(lambda d: d.awake(stack))
        how = killed or (f"from level {level}" if asleep else "started cold: it was stopped")
        self.store.events.record(stack, "woke", how)
        return WakeDone(stack, level, round(time.monotonic() - began, 3), lowest, killed)

    def _wake_watched(self, stack: str, container: str, level: int) -> tuple[str | None, int | None]:
        """The wake and its warm-up under the watchdog: why it was killed (None: it was not), and
        the least memory seen available."""
        engine, failed = self._engine(stack), None
        with MemoryWatch(self.wake_floor, lambda _: self.docker.kill(container)) as watch:
            try:
                engine.wake(level)
                engine.warm_up(self.catalog().stack(stack).served_name)
            except SparkctlError as e:
                failed = str(e).splitlines()[0]
        if watch.tripped is not None:
            why = (f"MemAvailable fell to {watch.tripped / GIB:.2f} GiB while it woke from level {level}, under the "
                   f"floor {self.wake_floor / GIB:.2f} GiB: killed, started cold")
        elif failed:
            self.docker.kill(container)
            why = f"the wake from level {level} failed ({failed}): killed, started cold"
        else:
            return None, watch.lowest
        log.warning("wake_killed", stack=stack, reason=why)
        self.store.events.record(stack, "wake killed", why)
        return why, watch.lowest

    def _engine(self, stack: str) -> SleepMode:
        return SleepMode(self.catalog().stack(stack).url)


EVERY = 0.05  # seconds between two reads (one costs well under a millisecond)


class MemoryWatch:
    """The wake watchdog (see above): `breach` runs once, the moment memory falls under `floor`."""

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
