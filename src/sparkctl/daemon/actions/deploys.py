"""`up` and `down` of a stack, each in the stack's turn, marked busy so reconcile passes leave it
alone. A parked stack that `up` names is woken first. A failed `up` of a stack that was not
desired leaves it not desired (the reconciler does not retry what the user saw fail)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sparkctl.daemon.actions.parking import Parking
from sparkctl.daemon.fetches import Fetches
from sparkctl.daemon.machine import DockerMachine
from sparkctl.daemon.metrics import DaemonMetrics
from sparkctl.daemon.reconciler import Reconciler
from sparkctl.daemon.routes import Routes
from sparkctl.daemon.seam import blocking
from sparkctl.daemon.turns import Turns
from sparkctl.deploy.progress import Stopped
from sparkctl.errors import SparkctlError
from sparkctl.messages import DownDone, PullDone, UpDone
from sparkctl.state.desired import DesiredFile


@dataclass(kw_only=True)
class Deploys:
    desired: DesiredFile
    machine: DockerMachine
    fetches: Fetches
    reconciler: Reconciler
    routes: Routes
    turns: Turns
    kick: Callable[[], None]  # ask the reconcile loop for a pass
    metrics: DaemonMetrics
    serving_since: dict[str, float]  # when each stack last came up or woke (monotonic)
    parking: Parking

    async def up(self, stack: str, *, refresh: bool = False, replace: bool = False, ticket: int | None = None,
                 stop: threading.Event | None = None) -> UpDone:
        """`stop`, set (a cancel of this `up`), ends its fetch streams: the deploy fails."""
        started = time.time()
        if stack in (await blocking(self.desired.read)).parked:  # `up` wants it serving: wake it, then confirm it
            await self.parking.wake(stack, ticket=ticket)
            ticket = None
        async with self.turns.turn(stack, ticket):
            was_desired = stack in (await blocking(self.desired.read)).stacks
            await blocking(self.desired.update, lambda d: d.with_stack(stack))
            self.reconciler.forget(stack)
            result = None
            try:
                with self.reconciler.holding(stack):
                    result = await blocking(self.machine.deploy, stack, refresh=refresh, replace=replace, stop=stop)
            except SparkctlError as e:  # a stack new to desired leaves it, as it was (the reconciler
                resumed = isinstance(e, Stopped) and self.fetches.stopping  # would retry it), unless the
                if not was_desired and not resumed:  # daemon's stop ended its fetch: the next daemon resumes it
                    await blocking(self.desired.update, lambda d: d.without_stack(stack))
                self.metrics.outcome(stack, ok=False)
                raise
            finally:
                if result is None or result.changed or not was_desired:  # else routes and Docker are as they were
                    await blocking(self.routes.refresh)
                    self.kick()
        if result is None:
            raise SparkctlError(f"{stack} was taken down while it was being deployed")
        self.metrics.outcome(stack, ok=True)
        self.metrics.phase("deploy", time.time() - started)
        self.serving_since[stack] = time.monotonic()
        return UpDone(stack, result.fingerprint, unchanged=not result.changed, url=result.url,
                      acceptance=result.acceptance)

    async def pull(self, stack: str, *, refresh: bool = False, ticket: int | None = None,
                   stop: threading.Event | None = None) -> PullDone:
        """Fetch and patch the stack, start nothing: it is not made desired, and shows as
        `fetched` until an `up` starts it. `stop`: as `up`'s."""
        async with self.turns.turn(stack, ticket):
            prepared = await blocking(self.machine.fetch, stack, refresh=refresh, stop=stop)
        return PullDone(stack, prepared.fingerprint)

    async def down(self, stack: str, *, ticket: int | None = None) -> DownDone:
        self.fetches.stop(stack)  # before its turn: a deploy fetching holds it
        async with self.turns.turn(stack, ticket):
            await blocking(self.desired.update, lambda d: d.without_stack(stack))
            with self.reconciler.holding(stack):
                removed = await blocking(self.machine.down, stack)
        self.kick()
        return DownDone(stack, removed)
