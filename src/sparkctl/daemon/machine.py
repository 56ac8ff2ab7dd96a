"""The daemon's `Machine` (the protocol in `reconciler.py`) on real adapters: containers found
by label, deploys through the pipeline, restarts with a health check, parking and waking with
vLLM's sleep mode under the wake watchdog, and the desired-state file. Each action on a stack
runs in that stack's turn (`turns.py`).

The wake watchdog (`MemoryWatch`): while a parked stack wakes, the memory still available
(MemAvailable and the kernel's per-CPU free lists, `deploy.memory.available`) is read every 50 ms,
and the moment it falls under the floor the waking engine is killed. On a Spark a wake that
exhausts unified memory can freeze the whole host (vLLM #50011); a killed engine only has to
start again."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import structlog

from sparkctl.adapters.docker import DockerEngine
from sparkctl.adapters.sleepmode import SleepMode
from sparkctl.daemon.planner import Observed
from sparkctl.daemon.turns import Turns
from sparkctl.deploy import health
from sparkctl.deploy.launch import Prepared, Staged, UpResult
from sparkctl.deploy.memory import GIB, available
from sparkctl.deploy.pipeline import Deployer
from sparkctl.deploy.progress import Reporter
from sparkctl.errors import SparkctlError
from sparkctl.messages import WakeDone
from sparkctl.policy.headroom import Headroom
from sparkctl.spec.load import Catalog
from sparkctl.spec.render import spec_hash
from sparkctl.state import desired as desired_file
from sparkctl.state.desired import Desired
from sparkctl.state.store import Store

log = structlog.get_logger()


GRACE = 30  # s an engine stopped with requests in flight has to finish them (Docker's stop timeout)


class DockerMachine:
    def __init__(self, *, docker: DockerEngine, deployer: Callable[[], Deployer], catalog: Callable[[], Catalog],
                 desired_path: Path, reporter: Reporter, store: Store, turns: Turns, wake_floor: int = 0) -> None:
        self.docker, self.deployer, self.catalog, self.store = docker, deployer, catalog, store
        self.desired_path, self.reporter, self.turns = desired_path, reporter, turns
        self.wake_floor = wake_floor  # bytes of MemAvailable under which a wake is killed
        self.fetching: dict[str, threading.Event] = {}  # stack -> its deploy, pull, patch check or bench run's stop
        self.stopping = False  # the daemon stops (`stop_all`)
        self._desired_lock = threading.Lock()

    def observe(self) -> list[Observed]:
        return [Observed(c.stack, c.id, c.state) for c in self.docker.containers() if not c.placed]

    def deploy(self, stack: str, *, refresh: bool = False, replace: bool = False, staged: Staged | None = None,
               stop: threading.Event | None = None) -> UpResult | None:
        """Deploy (or confirm) the stack, or start what `stage` made of it; None if a `down` got
        the lock first (it wins). `stop`, set, ends its fetch streams: the API's `up` passes its
        own, which a cancel of that `up` sets (`stop_fetching` sets it too)."""
        with self.turns.turn(stack):
            if stack not in self.desired().stacks:
                if staged is not None:
                    self.deployer().discard(staged, "not started: the stack was taken down meanwhile")
                return None
            self.fetching[stack] = stop = stop or threading.Event()
            try:
                result = self.deployer().up(stack, refresh=refresh, replace=replace, staged=staged, stop=stop)
            finally:
                self.fetching.pop(stack, None)
        if result.changed:  # a new engine: its KV headroom was read (the pipeline showed it as notes)
            log_headroom(stack, result.headroom)
        return result

    def fetch(self, stack: str, *, refresh: bool = False, stop: threading.Event | None = None) -> Prepared:
        """Fetch and patch the stack in its turn, starting nothing (`Deployer.fetch`); `stop` and
        a `down` stop its streams as they stop a deploy's."""
        with self.turns.turn(stack):
            self.fetching[stack] = stop = stop or threading.Event()
            try:
                return self.deployer().fetch(stack, refresh=refresh, stop=stop)
            finally:
                self.fetching.pop(stack, None)

    def fetched(self, stack: str) -> bool:
        """Whether the stack's latest deployment (or pull) fetched and patched what it needs, for
        the stack as its file is now (it recorded a fingerprint of this spec)."""
        latest = self.store.deployments.latest(stack)
        if latest is None or latest.fingerprint is None:
            return False
        try:
            return latest.parts.get("spec") == spec_hash(self.catalog().stack(stack))
        except SparkctlError:  # no such stack (any more): its fetch says so
            return False

    def deploy_absent(self, stack: str) -> UpResult | None:
        """The reconciler's deploy of a stack it saw with no container: none, if by its turn one
        runs (an `up` made it meanwhile), so a pass planned on what it saw before does not run the
        pipeline again on a stack just deployed."""
        with self.turns.turn(stack):
            if any(c.running for c in self.docker.containers(stack)):
                return None
            return self.deploy(stack)

    def stage(self, stack: str) -> Staged:
        """Prepare the stack and start its container, its engine behind a gate (`Deployer.stage`)."""
        with self.turns.turn(stack):
            return self.deployer().stage(stack)

    def discard(self, staged: Staged, why: str) -> None:
        with self.turns.turn(staged.stack):
            self.deployer().discard(staged, why)

    def stop_fetching(self, stack: str) -> bool:
        """End the fetch streams of a deploy (or pull) of the stack under way (a `down`, the
        daemon's stop): its turn ends soon after, not once every byte has arrived. False: none
        runs. A cancel names its action instead: it sets that action's own `stop`."""
        if (fetching := self.fetching.get(stack)) is not None:
            fetching.set()
        return fetching is not None

    def stop_all(self) -> None:
        """The daemon's stop: every fetch under way ends (a deploy fetching would hold the stop up
        until it ends), and an `up` it stops keeps its stack desired: the next daemon resumes it."""
        self.stopping = True
        for stack in list(self.fetching):
            self.stop_fetching(stack)

    def down(self, stack: str) -> int:
        with self.turns.turn(stack):
            return self.deployer().down(stack)

    def stop(self, stack: str, *, drained: bool = False) -> list[str]:
        """Stop the stack's running containers but keep them (a switch may start them again).
        `drained`: the gateway saw the stack's last request finish. With none in flight the
        engine's graceful shutdown on SIGTERM saves nothing and would make a switch's held
        requests wait it out (~0.1 s for the sim here, longer for vLLM, which stops its engine
        core first), so the engine is killed at once (a 0 s stop timeout); otherwise it gets
        `GRACE` to finish them. Its memory is free when the stop returns either way."""
        with self.turns.turn(stack):
            running = [c.id for c in self.docker.containers(stack) if c.running]
            for container in running:
                self.docker.stop(container, timeout=0 if drained else GRACE)
            return running

    def start(self, container: str) -> None:
        """Restart a dead engine container as it was, and wait until it is healthy again."""
        stack_name = self.docker.inspect(container).stack
        with self.turns.turn(stack_name):
            self.docker.start(container)
            self.store.events.record(stack_name, "restarted", container[:12])
            stack = self.catalog().stack(stack_name)
            engine = health.Engine(inspect=lambda: self.docker.inspect(container),
                                   logs=lambda n: self.docker.logs(container, tail=n))
            health.wait_healthy(stack, stack.url, engine, reporter=self.reporter)

    def park(self, stack: str, level: int, *, before: Callable[[], None] = lambda: None) -> None:
        """Asleep at `level` 1 or 2 (the container keeps running), or stopped (0). Recorded in
        desired.yaml before the engine is asked (a daemon killed meanwhile parks it again), then
        `before` runs (the gateway lets go of it); if the engine refuses, the record is undone."""
        with self.turns.turn(stack):
            self.update_desired(lambda d: d.park(stack, level))
            try:
                before()
                if level:
                    SleepMode(self.catalog().stack(stack).url).sleep(level)
                else:
                    self.stop(stack)
            except SparkctlError:
                self.update_desired(lambda d: d.awake(stack))
                raise
            self.store.events.record(stack, "parked", f"level {level}" if level else "stopped")

    def halt(self, stack: str, why: str) -> list[str]:
        """Stop the stack's engine at once (killed), outside its turn: the sentinel's stop when the
        host is at risk, and what holds the turn (a deploy's startup, a wake) may be what grows.
        Recorded parked (stopped) first, so the reconciler leaves it and its death is no crash; a
        request wakes it again once the gateway admits them."""
        self.update_desired(lambda d: d.park(stack, 0))
        running = [c.id for c in self.docker.containers(stack) if c.running and not c.placed]
        for container in running:
            self.docker.kill(container)
        self.store.events.record(stack, "parked", f"stopped by the sentinel: {why}")
        return running

    def wake(self, stack: str) -> WakeDone:
        """Wake a parked stack and warm it up with one token, under the wake watchdog. A wake that
        fails, or brings MemAvailable under the floor, is killed at once and the stack started
        cold instead; so is one whose engine died while it slept."""
        with self.turns.turn(stack):
            level = self.desired().parked.get(stack, 0)
            spec = self.catalog().stack(stack)
            [container] = [c.id for c in self.docker.containers(stack)][:1] or [None]
            if container is None:
                raise SparkctlError(f"{stack} is parked but has no container; `sparkctl up {stack}` deploys it again")
            killed, lowest, began = None, None, time.monotonic()
            asleep = level and self.docker.inspect(container).status == "running"
            if asleep:
                killed, lowest = self._wake_watched(stack, spec.url, spec.served_name, container, level)
            if not asleep or killed:
                self.start(container)
            self.update_desired(lambda d: d.awake(stack))
            how = killed or (f"from level {level}" if asleep else "started cold: it was stopped")
            self.store.events.record(stack, "woke", how)
            return WakeDone(stack, level, round(time.monotonic() - began, 3), lowest, killed)

    def _wake_watched(self, stack: str, url: str, served: str, container: str, level: int
                      ) -> tuple[str | None, int | None]:
        """The wake and its warm-up under the watchdog: why it was killed (None: it was not), and
        the least memory seen available."""
        engine, failed = SleepMode(url), None
        with MemoryWatch(self.wake_floor, lambda _: self.docker.kill(container)) as watch:
            try:
                engine.wake(level)
                engine.warm_up(served)
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

    def remove(self, container: str) -> None:
        self.docker.remove(container)

    def desired(self) -> Desired:
        with self._desired_lock:
            return desired_file.load(self.desired_path)

    def update_desired(self, change: Callable[[Desired], Desired]) -> Desired:
        with self._desired_lock:
            old = desired_file.load(self.desired_path)
            new = change(old)
            if new != old:  # e.g. `up` of a stack already desired: no write, no fsync
                desired_file.save(self.desired_path, new)
            return new


def log_headroom(stack: str, headroom: Headroom | None) -> None:
    """A deployed engine's KV headroom in the daemon's log; each shortfall a warning of its own."""
    if headroom is None:
        log.warning("kv_headroom_unknown", stack=stack)
        return
    log.info("kv_headroom", stack=stack, kv_tokens=headroom.kv_tokens, max_model_len=headroom.max_model_len,
             max_num_seqs=headroom.max_num_seqs, full_context=headroom.full_context)
    for warning in headroom.warnings():
        log.warning("kv_headroom_short", stack=stack, kv_tokens=headroom.kv_tokens, needed=headroom.needed,
                    min_kv_tokens=headroom.min_kv_tokens, warning=warning)


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
