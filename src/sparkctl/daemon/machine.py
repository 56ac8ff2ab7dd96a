"""The daemon's `Machine` (the protocol in `reconciler.py`) on real adapters: containers found
by label, deploys through the pipeline, restarts with a health check, and the desired-state
file. Each action on a stack runs in that stack's turn (`turns.py`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from sparkctl.adapters.docker import DockerEngine
from sparkctl.container import LABEL_STACK
from sparkctl.daemon.planner import Observed
from sparkctl.daemon.turns import Turns
from sparkctl.deploy import health
from sparkctl.deploy.pipeline import Deployer, UpResult
from sparkctl.deploy.progress import Reporter
from sparkctl.spec.load import Catalog
from sparkctl.state import desired as desired_file
from sparkctl.state.desired import Desired
from sparkctl.state.store import Store


class DockerMachine:
    def __init__(self, *, docker: DockerEngine, deployer: Callable[[], Deployer], catalog: Callable[[], Catalog],
                 desired_path: Path, reporter: Reporter, store: Store, turns: Turns) -> None:
        self.docker, self.deployer, self.catalog, self.store = docker, deployer, catalog, store
        self.desired_path, self.reporter, self.turns = desired_path, reporter, turns
        self._desired_lock = threading.Lock()

    def observe(self) -> list[Observed]:
        return [Observed(c.stack, c.id, c.state) for c in self.docker.containers()]

    def deploy(self, stack: str, *, refresh: bool = False, replace: bool = False) -> UpResult | None:
        """Deploy (or confirm) the stack; None if a `down` got the lock first (it wins)."""
        with self.turns.turn(stack):
            if stack not in self.desired().stacks:
                return None
            return self.deployer().up(stack, refresh=refresh, replace=replace)

    def down(self, stack: str) -> int:
        with self.turns.turn(stack):
            return self.deployer().down(stack)

    def stop(self, stack: str) -> list[str]:
        """Stop the stack's running containers but keep them (a switch may start them again)."""
        with self.turns.turn(stack):
            running = [c.id for c in self.docker.containers(stack) if c.running]
            for container in running:
                self.docker.stop(container)
            return running

    def start(self, container: str) -> None:
        """Restart a dead engine container as it was, and wait until it is healthy again."""
        stack_name = self.docker.inspect(container)["Config"]["Labels"][LABEL_STACK]
        with self.turns.turn(stack_name):
            self.docker.start(container)
            self.store.events.record(stack_name, "restarted", container[:12])
            stack = self.catalog().stack(stack_name)
            engine = health.Engine(state=lambda: self.docker.state(container),
                                   logs=lambda n: self.docker.logs(container, tail=n))
            health.wait_healthy(stack, stack.url, engine, reporter=self.reporter)

    def remove(self, container: str) -> None:
        self.docker.remove(container)

    def desired(self) -> Desired:
        with self._desired_lock:
            return desired_file.load(self.desired_path)

    def update_desired(self, change: Callable[[Desired], Desired]) -> Desired:
        with self._desired_lock:
            new = change(desired_file.load(self.desired_path))
            desired_file.save(self.desired_path, new)
            return new
