"""`up` and `down` of a stack, each in the stack's turn, marked busy so reconcile passes leave it
alone. A parked stack that `up` names is woken first. A failed `up` of a stack that was not
desired leaves it not desired (the reconciler does not retry what the user saw fail)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from sparkctl.daemon.actions.context import Context
from sparkctl.daemon.actions.parking import Parking
from sparkctl.deploy.progress import Stopped
from sparkctl.errors import SparkctlError
from sparkctl.messages import DownDone, PullDone, UpDone


@dataclass
class Deploys:
    ctx: Context
    parking: Parking

    def up(self, stack: str, *, refresh: bool = False, replace: bool = False, ticket: int | None = None,
           stop: threading.Event | None = None) -> UpDone:
        """`stop`, set (a cancel of this `up`), ends its fetch streams: the deploy fails."""
        started = time.time()
        if stack in self.ctx.machine.desired().parked:  # `up` wants it serving: wake it (in its turn), then confirm it
            self.parking.wake(stack, ticket=ticket)
            ticket = None
        with self.ctx.turns.turn(stack, ticket):
            was_desired = stack in self.ctx.machine.desired().stacks
            self.ctx.machine.update_desired(lambda d: d.with_stack(stack))
            self.ctx.reconciler.forget(stack)
            result = None
            try:
                with self.ctx.reconciler.holding(stack):
                    result = self.ctx.machine.deploy(stack, refresh=refresh, replace=replace, stop=stop)
            except SparkctlError as e:  # a stack new to desired leaves it, as it was (the reconciler
                resumed = isinstance(e, Stopped) and self.ctx.machine.stopping  # would retry it), unless the
                if not was_desired and not resumed:  # daemon's stop ended its fetch: the next daemon resumes it
                    self.ctx.machine.update_desired(lambda d: d.without_stack(stack))
                self.ctx.metrics.outcome(stack, ok=False)
                raise
            finally:
                if result is None or result.changed or not was_desired:  # else routes and Docker are as they were
                    self.ctx.routes.refresh()
                    self.ctx.kick()
        if result is None:
            raise SparkctlError(f"{stack} was taken down while it was being deployed")
        self.ctx.metrics.outcome(stack, ok=True)
        self.ctx.metrics.phase("deploy", time.time() - started)
        self.ctx.serving_since[stack] = time.monotonic()
        return UpDone(stack, result.fingerprint, unchanged=not result.changed, url=result.url,
                      acceptance=result.acceptance)

    def pull(self, stack: str, *, refresh: bool = False, ticket: int | None = None,
             stop: threading.Event | None = None) -> PullDone:
        """Fetch and patch the stack, start nothing: it is not made desired, and shows as
        `fetched` until an `up` starts it. `stop`: as `up`'s."""
        with self.ctx.turns.turn(stack, ticket):
            prepared = self.ctx.machine.fetch(stack, refresh=refresh, stop=stop)
        return PullDone(stack, prepared.fingerprint)

    def down(self, stack: str, *, ticket: int | None = None) -> DownDone:
        self.ctx.machine.stop_fetching(stack)  # before its turn: a deploy fetching holds it
        with self.ctx.turns.turn(stack, ticket):
            self.ctx.machine.update_desired(lambda d: d.without_stack(stack))
            with self.ctx.reconciler.holding(stack):
                removed = self.ctx.machine.down(stack)
        self.ctx.kick()
        return DownDone(stack, removed)

