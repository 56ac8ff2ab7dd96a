"""The reconciler's `Machine` on real adapters: containers found by label, deploys through the
pipeline, restarts with a health check, and the desired-state file."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from sparkctl.adapters.docker import DockerEngine
from sparkctl.container import LABEL_STACK
from sparkctl.daemon.planner import Observed
from sparkctl.deploy import health
from sparkctl.deploy.pipeline import Deployer, UpResult
from sparkctl.deploy.progress import Reporter
from sparkctl.spec.load import Catalog
from sparkctl.state import desired as desired_file
from sparkctl.state.desired import Desired
from sparkctl.state.store import Store


class DockerMachine:
    def __init__(self, *, docker: DockerEngine, deployer: Callable[[], Deployer], catalog: Callable[[], Catalog],
                 desired_path: Path, reporter: Reporter, store: Callable[[], Store]) -> None:
        self.docker, self._deployer, self._catalog, self._store = docker, deployer, catalog, store
        self.desired_path, self.reporter = desired_path, reporter
        self.locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)  # one action per stack
        self._desired_lock = threading.Lock()

    def observe(self) -> list[Observed]:
        return [Observed(c.stack, c.id, c.state) for c in self.docker.containers()]

    def deploy(self, stack: str, *, refresh: bool = False, replace: bool = False) -> UpResult | None:
        """Deploy (or confirm) the stack; None if a `down` got the lock first (it wins)."""
        with self.locks[stack]:
            if stack not in self.desired().stacks:
                return None
            return self._deployer().up(stack, refresh=refresh, replace=replace)

    def down(self, stack: str) -> int:
        with self.locks[stack]:
            return self._deployer().down(stack)

    def stop(self, stack: str) -> list[str]:
        """Stop the stack's running containers but keep them (a switch may start them again)."""
        with self.locks[stack]:
            running = [c.id for c in self.docker.containers(stack) if c.running]
            for container in running:
                self.docker.stop(container)
            return running

    def start(self, container: str) -> None:
        """Restart a dead engine container as it was, and wait until it is healthy again."""
        stack_name = self.docker.inspect(container)["Config"]["Labels"][LABEL_STACK]
        with self.locks[stack_name]:
            self.docker.start(container)
            self._store().record_event(stack_name, "restarted", container[:12])
            stack = self._catalog().stack(stack_name)
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
