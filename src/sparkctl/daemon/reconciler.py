"""The reconciler: observe once (containers by label), plan (pure, `planner.py`), act through
the deploy pipeline and the Docker adapter, record. Every action is idempotent, so a pass can
be repeated, interrupted or run after a `kill -9` and the machine still converges.

A coroutine on the daemon's loop, driven by its loops (Docker events plus a periodic resync);
the machine's blocking calls go through the seam, each action on a stack in that stack's turn.
Tested against a recording fake of its `Machine` with an injected clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Protocol

import structlog

from sparkctl.daemon import planner
from sparkctl.daemon.events import EventBus
from sparkctl.daemon.planner import Deploy, GiveUp, History, Observed, Prefetch, Realias, Remove, Restart, Wait
from sparkctl.daemon.seam import blocking
from sparkctl.daemon.turns import Turns
from sparkctl.deploy.launch import Prepared, UpResult
from sparkctl.errors import SparkctlError
from sparkctl.messages import Died, Failed, Prefetching, Realiased, Removed, Restarting, Settled
from sparkctl.state.desired import Desired

log = structlog.get_logger()


class Machine(Protocol):
    """What the reconciler does to the world; the daemon wires the real adapters in
    (`machine.py`), tests a recording fake."""

    def observe(self) -> list[Observed]: ...

    def deploy_absent(self, stack: str) -> UpResult | None: ...

    def fetch(self, stack: str) -> Prepared: ...

    def fetched(self, stack: str) -> bool: ...

    def start(self, container: str) -> None: ...

    def remove(self, container: str) -> None: ...


class Desires(Protocol):
    """The owner of desired.yaml (`state.desired.DesiredFile`)."""

    def read(self) -> Desired: ...

    def update(self, change: Callable[[Desired], Desired]) -> Desired: ...


class Reconciler:
    def __init__(self, machine: Machine, *, desired: Desires, turns: Turns, bus: EventBus, policy: planner.Policy,
                 clock: Callable[[], float], settled: Callable[[], None] = lambda: None) -> None:
        self.machine, self.desired, self.turns, self.bus = machine, desired, turns, bus
        self.policy, self.clock = policy, clock
        self.settled = settled  # an action finished: the world changed, so the loop should pass again
        self.history: dict[str, History] = {}
        self.wake_at: float | None = None  # when a backoff ends, the loop should pass again
        self.passes = 0
        self.restarts = 0
        self._restarting: set[str] = set()  # stacks whose dead engine a pass is starting again
        self._jobs: set[asyncio.Task] = set()  # its restarts, deploys and fetches under way

    async def reconcile(self) -> planner.Plan:
        """One pass: observe, plan, act."""
        self.passes += 1
        the_plan = await blocking(self._plan, dict(self.history))  # one crossing: a restart waits on none more
        self.wake_at = min((a.until for a in the_plan.of(Wait)), default=None)
        for action in the_plan.actions:
            await self._act(action)
        return the_plan

    def _plan(self, history: dict[str, History]) -> planner.Plan:
        desired = self.desired.read()
        return planner.plan(desired.stacks, desired.aliases, desired.fallbacks, self.machine.observe(), history,
                            now=self.clock(), policy=self.policy, parked=desired.parked, fetched=self.machine.fetched)

    async def died(self, stack: str, *, oom: bool, exit_code: int | None) -> bool:
        """A Docker `die`/`oom` event for one of our containers: count it as a failure (True)."""
        desired = await blocking(self.desired.read)
        h = self.history.get(stack, History())
        # Busy is our own stop or `down`, not a crash; but a pass may have seen the engine dead
        # and be starting it again before this event arrived: that death still counts.
        if (h.busy and stack not in self._restarting) or stack not in desired.stacks or stack in desired.parked:
            return False  # our own stop, a stack not wanted, or a parked one (waking starts it cold)
        self.history[stack] = replace(h, failures=(*h.failures, self.clock()))
        cause = "OOM-killed" if oom else f"exited with code {exit_code}"
        log.warning("engine_died", stack=stack, cause=cause)
        self.bus.publish(Died(stack, cause, oom))
        return True

    @contextmanager
    def holding(self, stack: str) -> Iterator[None]:
        """Mark the stack busy while the API works on it, so passes leave it alone."""
        self._busy(stack, +1)
        try:
            yield
        finally:
            self._busy(stack, -1)

    def _busy(self, stack: str, change: int) -> None:
        """Count one more (or one fewer) action in flight on the stack: a pass's deploy that ends
        while a switch holds the stack must not mark it idle."""
        h = self.history.get(stack, History())
        self.history[stack] = replace(h, busy=h.busy + change)

    def forget(self, stack: str) -> None:
        """The user asked for the stack again (`up`): clear its failures and failed mark."""
        self.history[stack] = History(busy=self.history.get(stack, History()).busy)

    async def close(self) -> None:
        """The daemon's stop: the actions under way end first."""
        await asyncio.gather(*self._jobs, return_exceptions=True)

    async def _act(self, action: planner.Action) -> None:
        if isinstance(action, Remove):
            log.info("container_removed", container=action.container[:12], reason=action.reason)
            await blocking(self.machine.remove, action.container)
            self.bus.publish(Removed(action.container, action.reason))
        elif isinstance(action, Restart):
            self.restarts += 1
            log.info("container_restarted", stack=action.stack, container=action.container[:12])
            self.bus.publish(Restarting(action.stack))
            self._restarting.add(action.stack)
            self._run(action.stack, self.machine.start, action.container)
        elif isinstance(action, Deploy):
            log.info("stack_deploying", stack=action.stack)
            self._run(action.stack, self.machine.deploy_absent, action.stack)
        elif isinstance(action, Prefetch):
            log.info("stack_prefetching", stack=action.stack, why=action.why)
            self.bus.publish(Prefetching(action.stack, action.why))
            self._run(action.stack, self.machine.fetch, action.stack)
        elif isinstance(action, GiveUp):
            self.history[action.stack] = replace(self.history.get(action.stack, History()), failed=action.reason)
            log.error("stack_failed", stack=action.stack, reason=action.reason)
            self.bus.publish(Failed(action.stack, action.reason))
        elif isinstance(action, Realias):
            alias, stack = action.alias, action.stack
            await blocking(self.desired.update,
                           lambda d: replace(d.with_stack(stack), aliases={**d.aliases, alias: stack}))
            log.warning("alias_fell_back", alias=action.alias, stack=action.stack, reason=action.reason)
            self.bus.publish(Realiased(action.alias, action.stack, action.reason))

    def _run(self, stack: str, work: Callable[[str], object], arg: str) -> None:
        """`work(arg)` in the stack's turn, on a worker, as a task of its own."""
        self._busy(stack, +1)

        async def job() -> None:
            error = None
            try:
                async with self.turns.turn(stack):
                    await blocking(work, arg)
            except SparkctlError as e:
                error = str(e)
            except Exception as e:  # noqa: BLE001 - a bug in one deploy must not kill the loop
                error = f"internal error: {type(e).__name__}: {e}"
            self._restarting.discard(stack)
            self._busy(stack, -1)
            if error:
                h = self.history[stack]
                self.history[stack] = replace(h, failures=(*h.failures, self.clock()))
                log.error("stack_action_failed", stack=stack, error=error.splitlines()[0])
            self.bus.publish(Settled(stack, error is None, error))
            self.settled()  # a failed restart must not wait for the next resync to be retried

        task = asyncio.create_task(job())
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)
