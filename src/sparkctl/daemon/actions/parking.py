"""Parking: a stack put to sleep (or stopped) as deep as memory allows, woken under the wake
watchdog, parked when idle, woken by a request that names it, and settled after a restart."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkctl.adapters.docker import DockerEngine
from sparkctl.daemon import planner
from sparkctl.daemon.events import EventBus
from sparkctl.daemon.reconciler import Reconciler
from sparkctl.daemon.routes import Routes
from sparkctl.daemon.seam import blocking
from sparkctl.daemon.sleeper import Sleeper
from sparkctl.daemon.turns import Turns
from sparkctl.deploy.memory import GIB, MemoryView
from sparkctl.errors import SparkctlError
from sparkctl.gateway.proxy import Gateway
from sparkctl.messages import Note, ParkDone, WakeDone
from sparkctl.policy.parking import Choice, Park, choose, sleep_refusal
from sparkctl.settings import Settings
from sparkctl.spec.load import Catalog
from sparkctl.spec.models import Kind, Stack
from sparkctl.state.desired import DesiredFile
from sparkctl.state.store import Store

if TYPE_CHECKING:
    from sparkctl.daemon.actions.machines import Machines


@dataclass(kw_only=True)
class Parking:
    settings: Settings
    catalog: Callable[[], Catalog]
    desired: DesiredFile
    docker: DockerEngine
    sleeper: Sleeper
    reconciler: Reconciler
    routes: Routes
    gateway: Gateway
    turns: Turns
    memory: Callable[[], MemoryView]
    # Held from a memory decision (switch, park, wake) until it is carried out, so two of them
    # never both count on the same free memory. Taken before any stack's turn, never after.
    memory_lock: asyncio.Lock
    bus: EventBus
    store: Store
    serving_since: dict[str, float]  # when each stack last came up or woke (monotonic)
    machines: Machines  # each stack's machine: this Spark's (the `_here` paths) or the fleet's
    started: float = field(default_factory=time.monotonic)

    async def park(self, stack: str, *, how: Park = Park.AUTO, ticket: int | None = None,
                   still: Callable[[], bool] = lambda: True) -> ParkDone:
        """Put a running stack to sleep (or stop it) as deep as `how` and the memory allow; its
        requests drain first. `still`: checked once in the stack's turn (an idle park that a
        request or a switch overtook does nothing). On the machine that runs it."""
        machine = await blocking(self.machines.of, stack)
        return await machine.park(stack, how=how, ticket=ticket, still=still)

    async def park_here(self, stack: str, *, how: Park, ticket: int | None, still: Callable[[], bool]) -> ParkDone:
        """On this Spark's Docker machine (`machines.Spark`)."""
        async with self.memory_lock, self.turns.turn(stack, ticket):
            choice = still() and await blocking(self._choose, stack, how)
            if not choice:
                return ParkDone(stack, "unchanged", f"{stack} is parked already or in use")
            with self.reconciler.holding(stack):
                await self.sleeper.park(stack, choice.park.level, before=lambda: self.quiesce(stack))
            await blocking(self.routes.refresh)
            return ParkDone(stack, str(choice.park), choice.why)

    def _choose(self, stack: str, how: Park) -> Choice | None:
        """How deep the stack parks (None: it is parked already)."""
        spec, desired = self.catalog().stack(stack), self.desired.read()
        if stack in desired.parked:
            return None
        view = self.memory()
        memory = view.now(desired.parked)
        if stack not in desired.stacks or stack not in memory.held:
            raise SparkctlError(f"{stack} is not running as a desired stack; nothing to park")
        beside = memory.beside(stack)
        return choose(how, view.footprint(stack), beside=beside, after=beside, ceiling=memory.ceiling,
                      unable=self.cannot_sleep(spec))

    async def quiesce(self, stack: str) -> None:
        """Before a stack sleeps: the gateway stops routing to it (its names now wake it) and its
        accepted requests finish."""
        await blocking(self.routes.refresh)
        await self.gateway.drain(stack)

    async def wake(self, stack: str, *, ticket: int | None = None) -> WakeDone:
        """Wake a parked stack, on the machine that runs it."""
        machine = await blocking(self.machines.of, stack)
        return await machine.wake(stack, ticket=ticket)

    async def wake_here(self, stack: str, *, ticket: int | None) -> WakeDone:
        """On this Spark's Docker machine, if its wake peak fits beside what runs."""
        async with self.memory_lock, self.turns.turn(stack, ticket):
            await blocking(self._fits, stack)
            try:
                with self.reconciler.holding(stack):
                    woken = await blocking(self.sleeper.wake, stack)
            finally:
                await blocking(self.routes.refresh)
            self.serving_since[stack] = time.monotonic()
            await blocking(self.record_wake, stack, woken)
            return woken

    def _fits(self, stack: str) -> None:
        """Raise unless the parked stack's wake peak fits beside what runs."""
        desired = self.desired.read()
        if stack not in desired.parked:
            raise SparkctlError(f"{stack} is not parked")
        view = self.memory()
        memory, level = view.now(desired.parked), desired.parked[stack]
        peak = memory.beside(stack) + view.footprint(stack).peak(level)
        if peak > memory.ceiling + 1e-9:
            raise SparkctlError(f"{stack} does not fit: waking it from level {level} would hold {peak:.2f} of "
                                f"memory at its peak, over the ceiling {memory.ceiling:.2f}; park or stop "
                                "another stack first")

    async def settle_parked(self) -> list[str]:
        """After a restart, `GET /is_sleeping` is the truth: a stack recorded parked that is awake
        (the daemon was killed mid-park or mid-wake) is parked again, before anything else wakes."""
        done = []
        desired, catalog = await blocking(self.desired.read), await blocking(self.catalog)
        running = {c.stack for c in await blocking(self.docker.containers) if c.running}
        for stack, level in desired.parked.items():
            if not level or stack not in running or stack not in catalog.stacks:
                continue
            try:
                if not await blocking(self.sleeper.sleeping, stack):
                    await self.sleeper.park(stack, level)
                    done.append(f"{stack} was awake though recorded parked: parked again at level {level}")
            except SparkctlError as e:
                done.append(f"{stack} is recorded parked, but its engine did not answer ({e}); stopping it")
                try:
                    await self.sleeper.park(stack, 0)
                except SparkctlError as again:
                    done.append(f"{stack} could not be stopped either: {again}")
        return done

    async def park_idle(self) -> None:
        """Park each stack whose `switch.idle_park` went by without a request through the gateway
        (its ledger). Called after each reconcile pass."""
        for stack, spec in await blocking(self._idle_parkers):
            def idle(stack: str = stack, ttl: float = spec.switch.idle_park) -> bool:
                quiet = self.gateway.quiet_since(stack)
                busy = self.reconciler.history.get(stack, planner.History()).busy
                since = max(quiet or 0.0, self.serving_since.get(stack, self.started))
                return quiet is not None and not busy and time.monotonic() - since >= ttl

            if idle():
                try:
                    await self.park(stack, how=spec.switch.park, still=idle)  # checked again in its turn
                except SparkctlError as e:
                    self.bus.publish(Note(stack, f"{stack} was idle but did not park: {e}"))

    def _idle_parkers(self) -> list[tuple[str, Stack]]:
        """The running stacks, not parked, that park when idle."""
        catalog, desired = self.catalog(), self.desired.read()
        specs = [(c.stack, catalog.stacks.get(c.stack)) for c in self.docker.containers()
                 if c.running and c.stack not in desired.parked]
        return [(name, spec) for name, spec in specs if spec is not None and spec.switch.idle_park is not None]

    async def wake_on_demand(self, stack: str) -> None:
        """A request named the parked stack (the gateway holds it meanwhile)."""
        machine = await blocking(self.machines.of, stack)
        if await blocking(machine.parked, stack):
            await machine.wake(stack, ticket=None)
        else:  # woken meanwhile (a switch, `up`): the routes may not say so yet
            await blocking(self.routes.refresh)

    def cannot_sleep(self, stack: Stack, *, waking: str | None = None) -> str | None:
        """Why the stack's engine cannot be parked with sleep mode, if it cannot. `waking`: a
        parked stack that wakes as this one parks (a switch's new stack), so it is no other sleeper."""
        if stack.kind is Kind.COMPOSE:
            return "stop: a compose project's engine is not run by sparkctl, so it does not sleep"
        if not stack.sleeps:
            return "stop: switch.park is stop, so its engine runs without sleep mode"
        latest = self.store.deployments.latest(stack.name)
        refused = self.store.images.policy().wake_refused(latest.parts.get("image") if latest else None)
        if refused:
            return f"stop: {refused}"
        settings, desired = self.settings, self.desired.read()
        kv = self.memory().kv_bytes(stack) if stack.resources.kv_cache == "planned" else None
        sleeping = tuple(s for s, level in desired.parked.items()
                         if level and s != waking) if settings.sleep_one_at_a_time else ()
        refused = sleep_refusal(stack.name, kv_bytes=kv, kv_limit=int(settings.wake_kv_max_gib * GIB),
                                sleeping=sleeping)
        if refused:
            return refused
        try:
            available = self.sleeper.available(stack.name)
        except SparkctlError as e:
            return f"stop: its engine did not answer ({str(e).splitlines()[0]})"
        if not available:
            return ("stop: the engine has no sleep-mode endpoints (GET /is_sleeping: 404): its platform has no "
                    "sleep mode (vLLM's CPU backend has none) or it runs without VLLM_SERVER_DEV_MODE=1")
        return None

    def record_wake(self, stack: str, woken: WakeDone) -> None:
        """The first watched wake of an image digest goes into the image policy's wake ledger; a failed one always."""
        latest = self.store.deployments.latest(stack)
        digest = latest.parts.get("image") if latest else None
        if not digest or not woken.level:
            return
        known = self.store.images.policy().wakes.get(digest)
        if woken.killed or known is None:
            try:
                self.store.images.record_wake(digest, ok=not woken.killed, reason=woken.killed or "")
            except (SparkctlError, OSError) as e:  # the wake stands; the ledger learns next time
                self.bus.publish(Note(stack, f"could not record how {digest} woke in the state: {e}"))

