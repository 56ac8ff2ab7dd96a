"""The reconciler's `Machine` (the protocol in `reconciler.py`) on real adapters: containers
found by label, deploys and fetches through the pipeline (each registered with the fetch-cancel
registry, `fetches.py`), stops, and the restart path (a dead engine started again and waited on
until healthy). Blocking: called through the seam, by a caller that holds the stack's turn."""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

from sparkctl.adapters.docker import DockerEngine
from sparkctl.daemon.fetches import Fetches
from sparkctl.daemon.planner import Observed
from sparkctl.deploy import health
from sparkctl.deploy.launch import Prepared, Staged, UpResult
from sparkctl.deploy.pipeline import Deployer
from sparkctl.deploy.progress import Reporter
from sparkctl.errors import SparkctlError
from sparkctl.policy.headroom import Headroom
from sparkctl.spec.load import Catalog
from sparkctl.spec.render import spec_hash
from sparkctl.state.desired import DesiredFile
from sparkctl.state.store import Store

log = structlog.get_logger()


GRACE = 30  # s an engine stopped with requests in flight has to finish them (Docker's stop timeout)


class DockerMachine:
    def __init__(self, *, docker: DockerEngine, deployer: Callable[[], Deployer], catalog: Callable[[], Catalog],
                 desired: DesiredFile, fetches: Fetches, reporter: Reporter, store: Store) -> None:
        self.docker, self.deployer, self.catalog, self.store = docker, deployer, catalog, store
        self.desired, self.fetches, self.reporter = desired, fetches, reporter

    def observe(self) -> list[Observed]:
        return [Observed(c.stack, c.id, c.state) for c in self.docker.containers() if not c.placed]

    def deploy(self, stack: str, *, refresh: bool = False, replace: bool = False, staged: Staged | None = None,
               stop: threading.Event | None = None) -> UpResult | None:
        """Deploy (or confirm) the stack, or start what `stage` made of it; None if a `down` got
        the lock first (it wins). `stop`, set, ends its fetch streams: the API's `up` passes its
        own, which a cancel of that `up` sets (`Fetches.stop` sets it too)."""
        if stack not in self.desired.read().stacks:
            if staged is not None:
                self.deployer().discard(staged, "not started: the stack was taken down meanwhile")
            return None
        with self.fetches.running(stack, stop) as stop:
            result = self.deployer().up(stack, refresh=refresh, replace=replace, staged=staged, stop=stop)
        if result.changed:  # a new engine: its KV headroom was read (the pipeline showed it as notes)
            log_headroom(stack, result.headroom)
        return result

    def fetch(self, stack: str, *, refresh: bool = False, stop: threading.Event | None = None) -> Prepared:
        """Fetch and patch the stack in its turn, starting nothing (`Deployer.fetch`); `stop` and
        a `down` stop its streams as they stop a deploy's."""
        with self.fetches.running(stack, stop) as stop:
            return self.deployer().fetch(stack, refresh=refresh, stop=stop)

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
        if any(c.running for c in self.docker.containers(stack)):
            return None
        return self.deploy(stack)

    def stage(self, stack: str) -> Staged:
        """Prepare the stack and start its container, its engine behind a gate (`Deployer.stage`)."""
        return self.deployer().stage(stack)

    def discard(self, staged: Staged, why: str) -> None:
        self.deployer().discard(staged, why)

    def down(self, stack: str) -> int:
        return self.deployer().down(stack)

    def stop(self, stack: str, *, drained: bool = False) -> list[str]:
        """Stop the stack's running containers but keep them (a switch may start them again).
        `drained`: the gateway saw the stack's last request finish. With none in flight the
        engine's graceful shutdown on SIGTERM saves nothing and would make a switch's held
        requests wait it out (~0.1 s for the sim here, longer for vLLM, which stops its engine
        core first), so the engine is killed at once (a 0 s stop timeout); otherwise it gets
        `GRACE` to finish them. Its memory is free when the stop returns either way."""
        running = [c.id for c in self.docker.containers(stack) if c.running]
        for container in running:
            self.docker.stop(container, timeout=0 if drained else GRACE)
        return running

    def start(self, container: str) -> None:
        """Restart a dead engine container as it was, and wait until it is healthy again."""
        stack_name = self.docker.inspect(container).stack
        self.docker.start(container)
        self.store.events.record(stack_name, "restarted", container[:12])
        stack = self.catalog().stack(stack_name)
        engine = health.Engine(inspect=lambda: self.docker.inspect(container),
                               logs=lambda n: self.docker.logs(container, tail=n))
        health.wait_healthy(stack, stack.url, engine, reporter=self.reporter)

    def remove(self, container: str) -> None:
        self.docker.remove(container)


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
