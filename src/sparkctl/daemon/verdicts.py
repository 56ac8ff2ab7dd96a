"""What a switch learns from measuring its new stack: the switch-over benchmark judged by the
stack's gate, then its quality gate if it has one, and, when a measurement fails on an image
digest that never passed, that digest blacklisted with the reason. The daemon hands these to
the Switcher."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparkctl.adapters.docker import DockerEngine
from sparkctl.bench import stack as bench_stack
from sparkctl.bench import switchover
from sparkctl.bench.gate import GateFailed
from sparkctl.daemon.events import EventBus
from sparkctl.deploy.health import HealthError
from sparkctl.messages import Note
from sparkctl.phase import Phase
from sparkctl.settings import Settings
from sparkctl.spec.models import Stack
from sparkctl.state.store import Store


@dataclass
class Verdicts:
    settings: Settings
    store: Store
    bus: EventBus
    stack: Callable[[str], Stack]  # a stack by name, from the current catalog
    docker: DockerEngine | None = None  # to record the engine's command line with the run

    def bench(self, name: str) -> dict[str, Any]:
        """The new primary's switch-over gates (`bench/switchover.py`): its `quick` benchmark through
        the gateway, then its quality gate if it has one."""
        return switchover.measure(self.stack(name), settings=self.settings, store=self.store, docker=self.docker,
                                  note=lambda text: self.bus.publish(Note(name, text)))

    def blame(self, name: str, cause: Exception) -> str | None:
        """A switch to `name` failed on a measurement (its benchmark gate, or the canary's acceptance
        floor): if the image digest it ran never passed, blacklist that digest with the reason."""
        latest = self.store.deployments.latest(name)
        if isinstance(cause, GateFailed):
            reason = cause.verdict.describe().removeprefix("fail: ")
        elif isinstance(cause, HealthError) and cause.phase is Phase.CANARY and latest is not None:
            reason = f"{str(cause).splitlines()[0]} (deployment {latest.id})"
        else:
            return None
        digest = latest.parts.get("image", "") if latest else ""
        if not bench_stack.blacklist_if_new(self.stack(name), digest, reason, store=self.store):
            return None
        self.store.events.record(name, "blacklisted", f"{digest}: {reason}")
        return f"blacklisted image {digest} ({reason}); `sparkctl image unblacklist {digest}` undoes it"
