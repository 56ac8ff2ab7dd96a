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
from sparkctl.deploy.launch import UpResult
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
            self.reconciler.forget(stack)
            try:
                with self.reconciler.holding(stack):
                    result, changed = await blocking(self._up, stack, refresh=refresh, replace=replace, stop=stop)
            except SparkctlError:
                self.metrics.outcome(stack, ok=False)
                self.kick()
                raise
            if changed:  # else routes and Docker are as they were
                self.kick()
        if result is None:
            raise SparkctlError(f"{stack} was taken down while it was being deployed")
        self.metrics.outcome(stack, ok=True)
        self.metrics.phase("deploy", time.time() - started)
        self.serving_since[stack] = time.monotonic()
        return UpDone(stack, result.fingerprint, unchanged=not result.changed, url=result.url,
                      acceptance=result.acceptance)

    def _up(self, stack: str, *, refresh: bool, replace: bool, stop: threading.Event | None
            ) -> tuple[UpResult | None, bool]:
        """The stack made desired and deployed, in one crossing (blocking), and whether that changed
        anything (then the routes were rebuilt). A stack new to desired leaves it if its deploy fails, as it was (the
        reconciler would retry it), unless the daemon's stop ended its fetch: the next daemon resumes it."""
        was_desired = stack in self.desired.read().stacks
        self.desired.update(lambda d: d.with_stack(stack))
        result = None
        try:
            result = self.machine.deploy(stack, refresh=refresh, replace=replace, stop=stop)
        except SparkctlError as e:
            if not was_desired and not (isinstance(e, Stopped) and self.fetches.stopping):
                self.desired.update(lambda d: d.without_stack(stack))
            raise
        finally:
            if changed := result is None or result.changed or not was_desired:
                self.routes.refresh()
        return result, changed

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
