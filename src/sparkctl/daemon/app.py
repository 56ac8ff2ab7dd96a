"""`sparkctl daemon`: wires the reconciler, the Docker event watcher, the periodic resync and
the local API; runs in the foreground with structured logs until SIGTERM/SIGINT. Engine
containers keep running when it stops: a restarted daemon adopts them by label.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from functools import cached_property
from typing import Any

import structlog
from aiohttp import web

from sparkctl.adapters.docker import DockerEngine
from sparkctl.daemon import api, planner, process
from sparkctl.daemon.events import BusReporter, EventBus
from sparkctl.daemon.loops import Loops
from sparkctl.daemon.machine import DockerMachine
from sparkctl.daemon.metrics import DaemonMetrics
from sparkctl.daemon.reconciler import Reconciler
from sparkctl.daemon.switch import Switcher, recover
from sparkctl.daemon.verdicts import Verdicts
from sparkctl.deploy.pipeline import Deployer, memory_shares
from sparkctl.deploy.status import other_instances, status_rows
from sparkctl.errors import ImageRefused, SparkctlError
from sparkctl.gateway.proxy import Gateway, LoopControl
from sparkctl.gateway.routes import RouteTable, build_table
from sparkctl.gateway.server import Limits
from sparkctl.policy.switch import plan_switch
from sparkctl.settings import Settings
from sparkctl.spec.imagefile import load_policy
from sparkctl.spec.load import Catalog, catalog_for
from sparkctl.state.store import Store

log = structlog.get_logger()


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        policy = planner.Policy(crash_loop=settings.crash_loop, window=settings.crash_window,
                                backoff_base=settings.restart_backoff_base, backoff_max=settings.restart_backoff_max)
        self.bus = EventBus()
        self.metrics = DaemonMetrics()
        self.docker = DockerEngine(settings.docker_host, instance=settings.instance)
        self.machine = DockerMachine(docker=self.docker, deployer=self.deployer, catalog=self.catalog,
                                     desired_path=settings.state_dir / "desired.yaml", reporter=BusReporter(self.bus),
                                     store=lambda: self.store)
        self.reconciler = Reconciler(self.machine, bus=self.bus, policy=policy, clock=time.time,
                                     settled=lambda: self.kick())
        self.loops = Loops(reconciler=self.reconciler, docker=self.docker, store=lambda: self.store,
                           instance=settings.instance, resync=settings.resync_interval, after_pass=self.refresh_routes)
        self.routes = RouteTable()  # what the gateway routes to; rebuilt after every pass
        self._routes_lock = threading.Lock()  # one rebuild at a time: a stale one must not win
        self.gateway: LoopControl | None = None  # set once the gateway listens

    # --- wiring ---------------------------------------------------------------------------
    def catalog(self) -> Catalog:
        """Stack files are read afresh for each action, so edits apply without a restart."""
        return catalog_for(self.settings)

    def deployer(self) -> Deployer:
        return Deployer.build(self.settings, catalog=self.catalog(), policy=load_policy(self.settings.images_file),
                              docker=self.docker, store=self.store, reporter=BusReporter(self.bus))

    @cached_property
    def store(self) -> Store:
        return Store(self.settings.store_path)

    @cached_property
    def verdicts(self) -> Verdicts:
        return Verdicts(self.settings, self.store, self.bus, lambda name: self.catalog().stack(name))

    # --- what the API calls -------------------------------------------------------------------
    def check_stack(self, name: str) -> str:
        return self.catalog().stack(name).name

    def up(self, stack: str, *, refresh: bool = False, replace: bool = False) -> dict[str, Any]:
        was_desired = stack in self.machine.desired().stacks
        self.machine.update_desired(lambda d: d.with_stack(stack))
        self.reconciler.forget(stack)
        started = time.time()
        try:
            with self.reconciler.holding(stack):
                result = self.machine.deploy(stack, refresh=refresh, replace=replace)
        except ImageRefused:  # the policy refuses it: retrying cannot help, so a new stack is not kept desired
            if not was_desired:
                self.machine.update_desired(lambda d: d.without_stack(stack))
            self.metrics.outcome(stack, ok=False)
            raise
        except SparkctlError:
            self.metrics.outcome(stack, ok=False)
            raise
        finally:
            self.refresh_routes()
            self.kick()
        if result is None:
            raise SparkctlError(f"{stack} was taken down while it was being deployed")
        self.metrics.outcome(stack, ok=True)
        self.metrics.phase("deploy", time.time() - started)
        return {"stack": stack, "fingerprint": result.fingerprint, "unchanged": not result.changed}

    def down(self, stack: str) -> dict[str, Any]:
        self.machine.update_desired(lambda d: d.without_stack(stack))
        with self.reconciler.holding(stack):
            removed = self.machine.down(stack)
        self.kick()
        return {"stack": stack, "removed": removed}

    def switch(self, alias: str, stack: str) -> dict[str, Any]:
        """Move `alias` to `stack` (blue/green or hold/swap); rolled back on any failure."""
        spec = self.catalog().stack(stack)
        if self.machine.desired().aliases.get(alias) == spec.name:  # as `up` does: make sure, change nothing
            return {"alias": alias, "stack": spec.name, "mode": "unchanged", "timings": {}, "up": self.up(spec.name)}
        plan = plan_switch(alias, spec.name, fraction=spec.resources.gpu_memory_utilization,
                           aliases=self.machine.desired().aliases, running=memory_shares(self.docker),
                           ceiling=self.settings.memory_ceiling)
        assert self.gateway is not None, "the gateway starts before the API"
        self.reconciler.forget(spec.name)
        switcher = Switcher(machine=self.machine, reconciler=self.reconciler, gateway=self.gateway,
                            refresh_routes=self.refresh_routes, store=self.store, reporter=BusReporter(self.bus),
                            bench=self.verdicts.bench, bench_mode=lambda s: self.catalog().stack(s).switch.bench,
                            blame=self.verdicts.blame)
        try:
            return switcher.run(plan)
        finally:
            self.kick()

    def status(self) -> dict[str, Any]:
        """The CLI's status rows, plus desired stacks without a container and failure marks."""
        desired = self.machine.desired()
        rows = status_rows(self.docker, self.store, self.catalog())
        seen = {r["stack"] for r in rows}
        rows += [{"stack": s, "phase": "failed" if self.reconciler.history.get(s, planner.History()).failed
                  else "pending", "state": "absent", "endpoint": "", "fingerprint": None, "container": "",
                  "uptime_s": None, "memory": None, "error": None} for s in desired.stacks if s not in seen]
        for row in rows:
            h = self.reconciler.history.get(row["stack"], planner.History())
            row |= {"desired": row["stack"] in desired.stacks, "failed": h.failed, "recent_failures": len(h.failures)}
        return {"stacks": rows, "aliases": desired.aliases, "pid": os.getpid(), "instance": self.settings.instance,
                "others": other_instances(self.docker)}

    def history(self, stack: str | None) -> dict[str, Any]:
        deployments = [{"id": d.id, "stack": d.stack, "phase": d.phase.value, "fingerprint": d.fingerprint,
                 "started": d.started, "finished": d.finished, "error": d.error,
                        "transitions": [(p.value, at, detail) for p, at, detail in self.store.transitions(d.id)]}
                       for d in self.store.history(stack)]
        return {"deployments": deployments, "events": self.store.events(stack), "switches": self.store.switches()}

    def metrics_text(self) -> str:
        states = {o.stack: o.state for o in self.machine.observe()}
        states |= {s: "failed" for s, h in self.reconciler.history.items() if h.failed}
        return self.metrics.render(passes=self.reconciler.passes, restarts=self.reconciler.restarts, states=states)

    def refresh_routes(self) -> None:
        """Point the gateway at running containers whose deployment passed its health checks (a
        failed redeploy leaves the previous, healthy one routed; one still loading is not)."""
        with self._routes_lock:  # reads and replaces as one: a rebuild from older reads must not land last
            running = {c.stack for c in self.docker.containers()
                       if c.running and c.fingerprint in self.store.healthy_fingerprints(c.stack)}
            stacks = {s.name: (s.served_name, s.port, s.max_concurrency) for s in self.catalog().deployable()}
            self.routes = build_table(aliases=self.machine.desired().aliases, stacks=stacks, running=running)

    def kick(self) -> None:
        """Ask for a reconcile pass now."""
        self.loops.kick()

    def _adopt_unlabelled(self) -> None:
        """Containers made before instances existed carry no instance label; the default instance
        takes them as its own (its next deploy of each labels it). Recorded once per container."""
        adopted = {e["detail"] for e in self.store.events(limit=1000) if e["kind"] == "adopted"}
        for c in self.docker.containers():
            if not c.labelled and c.id[:12] not in adopted:
                log.info("container_adopted", stack=c.stack, container=c.id[:12],
                         reason="made before instances; labelled at its next deploy")
                self.store.record_event(c.stack, "adopted", c.id[:12])

    async def _serve_gateway(self) -> tuple[Gateway, asyncio.Server]:
        """The agent-facing OpenAI endpoint (SPARKCTL_GATEWAY_HOST:PORT, loopback by default)."""
        s = self.settings
        keys = [k.get_secret_value() for k in s.gateway_api_keys]
        limits = Limits(connections=min(s.gateway_max_connections, process.open_files() - 128))
        gateway = Gateway(lambda: self.routes, api_keys=keys, hosts=s.gateway_names, metrics_key=s.gateway_metrics_key,
                          limits=limits)
        self.gateway = LoopControl(gateway, asyncio.get_running_loop(), hold_queue=s.switch_hold_queue,
                                   hold_timeout=s.switch_hold_timeout, drain_timeout=s.switch_drain_timeout)
        handed = process.handed_socket()
        server = await gateway.serve(s.gateway_host, s.gateway_port, sock=handed)
        log.info("gateway_listening", address=str(handed.getsockname() if handed else (s.gateway_host, s.gateway_port)),
                 max_connections=limits.connections, socket="handed over by systemd" if handed else "own")
        asyncio.get_running_loop().create_task(self._report_refusals(limits))
        return gateway, server

    async def _report_refusals(self, limits: Limits) -> None:
        """Connections or bodies the gateway refused, logged at most once per interval (a flood
        must not flood the log too)."""
        while True:
            await asyncio.sleep(10)
            refused = limits.report_due()
            if refused:
                log.warning("gateway_refused", count=refused, open=limits.open, max_connections=limits.connections,
                            hint="raise SPARKCTL_GATEWAY_MAX_CONNECTIONS (and LimitNOFILE) if this is real load")

    async def _serve_tcp(self) -> web.AppRunner | None:
        """The optional loopback TCP listener: only with SPARKCTL_API_TCP and SPARKCTL_API_TOKEN."""
        s = self.settings
        if not s.api_tcp:
            return None
        if not s.api_token or not s.api_token.get_secret_value():
            raise SparkctlError("SPARKCTL_API_TCP is set but SPARKCTL_API_TOKEN is not: refusing an open TCP API")
        host, _, port = s.api_tcp.rpartition(":")
        runner = web.AppRunner(api.build(self, token=s.api_token.get_secret_value()), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host.strip("[]"), int(port)).start()
        log.info("daemon_listening_tcp", address=s.api_tcp)
        return runner

    async def serve(self) -> None:
        lock = process.exclusive(self.settings.lock_path)  # held until the process ends
        for interrupted in self.store.interrupt_unfinished("interrupted: the daemon stopped mid-deploy"):
            log.warning("deployment_interrupted", deployment=interrupted)
        for settled in recover(self.machine, self.store):
            log.warning("switch_interrupted", outcome=settled)
        self._adopt_unlabelled()
        if removed := self.docker.remove_scratch():
            log.info("scratch_containers_removed", count=removed, reason="left by a daemon that was killed")
        self.refresh_routes()  # before the gateway listens: a restarted daemon routes what runs at once
        path = self.settings.socket_path
        path.unlink(missing_ok=True)  # a dead daemon's: a live one would hold the lock
        gateway, gateway_server = await self._serve_gateway()  # before the API: a switch needs it
        runner = web.AppRunner(api.build(self), access_log=None)
        await runner.setup()
        old = os.umask(0o177)  # the socket is born 0600: no window with looser permissions
        try:
            await web.UnixSite(runner, str(path)).start()
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        log.info("daemon_listening", socket=str(path), pid=os.getpid())
        tcp = await self._serve_tcp()
        self.loops.start()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("daemon_stopping", note="engine containers keep running")
        gateway_server.close()  # new connections wait in the socket's queue when systemd holds it
        if not await gateway.finish(timeout=self.settings.switch_drain_timeout):
            log.warning("gateway_requests_cut", note="in-flight requests outlived the drain timeout")
        self.loops.stop()
        await runner.cleanup()
        gateway.close()
        if tcp is not None:
            await tcp.cleanup()
        self.reconciler.close()
        path.unlink(missing_ok=True)
        lock.close()
        log.info("daemon_stopped")
