"""`sparkctl daemon`: wires the reconciler, the Docker event watcher, the periodic resync and
the local API; runs in the foreground with structured logs until SIGTERM/SIGINT. Engine
containers keep running when it stops: a restarted daemon adopts them by label.
"""

from __future__ import annotations

import asyncio
import errno
import faulthandler
import os
import signal
import time
from pathlib import Path

import structlog
from aiohttp import web

from sparkctl.adapters import hub, processes
from sparkctl.adapters.placements import PlacementFile
from sparkctl.daemon import api, planner, process, seam
from sparkctl.daemon.actions import Actions, Aliases, Benchmarks, Deploys, ImageBook, Parking, PatchChecks, Trials
from sparkctl.daemon.actions.machines import Fleet, Machines, Spark
from sparkctl.daemon.actions.switch import Switcher, recover
from sparkctl.daemon.api.actions import Underway
from sparkctl.daemon.api.service import Gauge
from sparkctl.daemon.events import BusReporter, EventBus
from sparkctl.daemon.fetches import Fetches
from sparkctl.daemon.loops import Loops
from sparkctl.daemon.machine import DockerMachine
from sparkctl.daemon.metrics import DaemonMetrics
from sparkctl.daemon.reads import Reads
from sparkctl.daemon.reconciler import Reconciler
from sparkctl.daemon.routes import Routes
from sparkctl.daemon.seam import GatewayFromThread, blocking
from sparkctl.daemon.sentinel import Sentinel
from sparkctl.daemon.series import Recorder, readings
from sparkctl.daemon.sleeper import Sleeper
from sparkctl.daemon.turns import Turns
from sparkctl.daemon.verdicts import Verdicts
from sparkctl.deploy.memory import GIB, MemoryView
from sparkctl.errors import SparkctlError
from sparkctl.fleet import local, membership, placement
from sparkctl.fleet.deploy import Fleetwide
from sparkctl.fleet.machine import FleetMachine
from sparkctl.fleet.watch import FleetWatch
from sparkctl.gateway.exchange import Bounds
from sparkctl.gateway.limits import Limits
from sparkctl.gateway.login import Logins, ensure_key
from sparkctl.gateway.pool import EnginePool
from sparkctl.gateway.proxy import Gateway, Waker
from sparkctl.gateway.tokens import Counters
from sparkctl.gateway.ui import Dashboard
from sparkctl.policy.switch import Memory
from sparkctl.settings import Settings
from sparkctl.spec.fleet import load_fleet
from sparkctl.state.desired import DesiredFile
from sparkctl.wiring import Wiring

log = structlog.get_logger()

SLOW_STOP = 10.0  # seconds: a stop still running then dumps every thread's stack to stderr


class Daemon:
    """The daemon's composition root: every part built here once, in dependency order, each handed
    what it uses at construction (actions and reads, reconcile loop, event watcher, API, gateway,
    fleet watch); then their lifecycle. Made inside the event loop it serves on (`run`): the
    event bus and the fleet's crossing to the gateway hold that loop."""

    def __init__(self, settings: Settings) -> None:
        self.settings = s = settings
        policy = planner.Policy(crash_loop=s.crash_loop, window=s.crash_window,
                                backoff_base=s.restart_backoff_base, backoff_max=s.restart_backoff_max)
        self.bus = EventBus(asyncio.get_running_loop())
        wiring, reporter = Wiring(s), BusReporter(self.bus)
        self.docker, self.store, catalog = wiring.docker, wiring.store, wiring.catalog
        self.desired, self.fetches, turns = DesiredFile(s.state_dir / "desired.yaml"), Fetches(), Turns()
        parked = lambda: self.desired.read().parked  # noqa: E731 - the deployer asks the owner of desired.yaml
        self.machine = DockerMachine(docker=self.docker, deployer=lambda: wiring.deployer(reporter, parked=parked),
                                     catalog=catalog, desired=self.desired, fetches=self.fetches, reporter=reporter,
                                     store=self.store)
        self.sleeper = Sleeper(machine=self.machine, docker=self.docker, catalog=catalog, desired=self.desired,
                               store=self.store, wake_floor=int(s.wake_memory_floor_gib * GIB))
        # The reconciler asks the loop that runs it for the next pass: the one cycle, closed by a lambda.
        self.reconciler = Reconciler(self.machine, desired=self.desired, turns=turns, bus=self.bus, policy=policy,
                                     clock=time.time, settled=lambda: self.loops.kick())
        fleetwide = _fleetwide(s)  # None unless this Spark heads a fleet
        self.routes = Routes(self.docker, self.store, catalog, self.desired.read,
                             placed=fleetwide.book.entries if fleetwide else dict,
                             engine_auth=lambda: membership.relay_auth(s),
                             restarting=lambda: self.sentinel.restarting())
        self.loops = Loops(reconciler=self.reconciler, docker=self.docker, store=self.store,
                           instance=s.instance, resync=s.resync_interval, after_pass=self._after_pass)
        self.limits = Limits(connections=min(s.gateway_max_connections, processes.open_files() - 128),
                             upload_time=s.gateway_upload_timeout)
        upstreams = EnginePool()
        self.gateway = Gateway(
            lambda: self.routes.table, api_keys=[k.get_secret_value() for k in s.gateway_api_keys],
            hosts=s.gateway_names, metrics_key=s.gateway_metrics_key, limits=self.limits,
            hold_queue=s.switch_hold_queue, hold_timeout=s.switch_hold_timeout, drain_timeout=s.switch_drain_timeout,
            bounds=Bounds(deadline=s.gateway_request_deadline, client_pause=s.gateway_client_pause,
                          stall=s.gateway_stream_stall, first_byte=s.gateway_first_byte_timeout),
            upstreams=upstreams,
            waker=Waker(self._wake_on_demand, limit=s.switch_hold_queue, timeout=s.switch_hold_timeout),
            counters=Counters(self._model_dir),
            ui=Dashboard(f"unix:{s.socket_path}", upstreams, Logins(ensure_key(s.dashboard_key_path))))
        # The fleet's own threads (its watch, its actions' work on workers) reach the gateway through the seam.
        control = GatewayFromThread(self.gateway, asyncio.get_running_loop())
        fleet = fleetwide and Fleet(FleetMachine(fleetwide=fleetwide, catalog=catalog, desired=self.desired,
                                                 routes=self.routes, store=self.store, gateway=control,
                                                 total_bytes=local.memory_total(s), wait=s.fleet_deploy_timeout),
                                    turns)
        machines = Machines(fleet)

        def view() -> MemoryView:  # the memory adapter, made here only
            return MemoryView(s, self.store, catalog(), self.docker)

        def memory() -> Memory:  # unified memory as the planner sees it: status and the time series
            return view().now(self.desired.read().parked)

        self.serving_since: dict[str, float] = {}  # when each stack last came up or woke (monotonic)
        metrics, memory_lock = DaemonMetrics(), asyncio.Lock()
        parking = Parking(settings=s, catalog=catalog, desired=self.desired, docker=self.docker, sleeper=self.sleeper,
                          reconciler=self.reconciler, routes=self.routes, gateway=self.gateway, turns=turns,
                          memory=view, memory_lock=memory_lock, bus=self.bus, store=self.store,
                          serving_since=self.serving_since, machines=machines)
        deploys = Deploys(desired=self.desired, machine=self.machine, fetches=self.fetches, reconciler=self.reconciler,
                          routes=self.routes, turns=turns, kick=self.loops.kick, metrics=metrics,
                          serving_since=self.serving_since, parking=parking)
        verdicts = Verdicts(s, self.store, self.bus, lambda name: catalog().stack(name), self.docker)
        switcher = Switcher(machine=self.machine, sleeper=self.sleeper, desired=self.desired,
                            reconciler=self.reconciler, turns=turns, gateway=self.gateway,
                            refresh_routes=self.routes.refresh, store=self.store, reporter=reporter,
                            bench=verdicts.bench, blame=verdicts.blame, woke=parking.record_wake,
                            bench_mode=lambda name: catalog().stack(name).switch.bench)
        aliases = Aliases(settings=s, catalog=catalog, desired=self.desired, reconciler=self.reconciler,
                          routes=self.routes, turns=turns, memory=view, memory_lock=memory_lock,
                          store=self.store, kick=self.loops.kick, serving_since=self.serving_since,
                          switcher=switcher, deploys=deploys, parking=parking, machines=machines)
        machines.spark = Spark(parking, aliases)
        trials = Trials(settings=s, catalog=catalog, deployer=self.machine.deployer,
                        reconciler=self.reconciler, turns=turns, store=self.store)
        self.actions = Actions(
            bus=self.bus, turns=turns, deploys=deploys, parking=parking, aliases=aliases, trials=trials, fleet=fleet,
            patches=PatchChecks(deployer=self.machine.deployer, turns=turns, fetches=self.fetches),
            bench=Benchmarks(settings=s, store=self.store, docker=self.docker, catalog=catalog, turns=turns,
                             holding=self.reconciler.holding, reporter=reporter, fetches=self.fetches),
            images=ImageBook(records=self.store.images, policy=wiring.policy,
                             registry_digest=lambda ref: self.docker.registry_digest(ref, mirrors=s.registry_mirrors)))
        self.recorder = Recorder(engines=lambda: readings(self.routes.table), memory=memory,
                                 requests=self.gateway.ledger.snapshot)
        self.sentinel = Sentinel(gateway=self.gateway, routes=self.routes, sleeper=self.sleeper, docker=self.docker,
                                 store=self.store, state_dir=s.state_dir,
                                 kernel_log=s.kernel_log, meminfo_path=s.meminfo_path,
                                 floor=int(s.wake_memory_floor_gib * GIB), hang_after=s.hang_after,
                                 started=self._started,
                                 failed=lambda name: bool(self.reconciler.history.get(name, planner.History()).failed))
        self.follows = Gauge()  # the log follows open, on both listeners of the API
        self.underway: dict[str, Underway] = {}  # the API's actions under way by name, on both listeners
        self.reads = Reads(s, self.desired, catalog, self.docker, self.store, self.reconciler, self.routes, metrics,
                           self.recorder, memory)
        self.fleet_watch = fleetwide and FleetWatch(
            fleetwide, control=control,
            refresh=self.routes.refresh, bus=self.bus,
            wait=s.fleet_deploy_timeout, within=s.fleet_replace_within,
            policy=policy, backoff=lambda failures: planner.backoff(failures, policy),
            served_name=lambda name: catalog().stack(name).served_name)

    def _started(self) -> dict[str, float]:
        """Each running engine of this instance, not parked: when it last started or woke (epoch s),
        for the sentinel to stop the one that grew last."""
        parked, shift = self.desired.read().parked, time.time() - time.monotonic()
        return {c.stack: max(c.created, self.serving_since.get(c.stack, 0.0) + shift) for c in self.docker.containers()
                if c.running and not c.placed and c.stack not in parked}

    async def _after_pass(self) -> None:
        """Routes rebuilt from what runs now; stacks idle past their `switch.idle_park` parked."""
        await blocking(self.routes.refresh)
        await self.actions.parking.park_idle()

    async def _recover(self) -> None:
        """What a killed daemon left: unfinished deployments and switches, parked stacks awake,
        scratch containers, and containers made before instances. Routes are rebuilt before the
        gateway listens, so a restarted daemon routes what runs at once."""
        unfinished = self.store.deployments.interrupt_unfinished
        for interrupted in await blocking(unfinished, "interrupted: the daemon stopped mid-deploy"):
            log.warning("deployment_interrupted", deployment=interrupted)
        for parked in await self.actions.parking.settle_parked():  # asleep as recorded, before any wake
            log.warning("parked_settled", detail=parked)
        for settled in await recover(self.desired, self.sleeper, self.machine, self.store):
            log.warning("switch_interrupted", outcome=settled)
        await blocking(self._adopt_unlabelled)
        if removed := await blocking(self.docker.remove_scratch):
            log.info("scratch_containers_removed", count=removed, reason="left by a daemon that was killed")
        await blocking(self.routes.refresh)

    def _adopt_unlabelled(self) -> None:
        """Containers made before instances existed carry no instance label; the default instance
        takes them as its own (its next deploy of each labels it). Recorded once per container."""
        adopted = {e["detail"] for e in self.store.events.list(limit=1000) if e["kind"] == "adopted"}
        for c in self.docker.containers():
            if not c.labelled and c.id[:12] not in adopted:
                log.info("container_adopted", stack=c.stack, container=c.id[:12],
                         reason="made before instances; labelled at its next deploy")
                self.store.events.record(c.stack, "adopted", c.id[:12])

    def _model_dir(self, stack: str) -> Path:
        """Where a stack's model snapshot is in the HF cache (its tokenizer counts routed prompts)."""
        model = self.machine.catalog().stack(stack).model
        if model is None or model.repo is None:
            raise SparkctlError(f"{stack} names no model repo, so it has no tokenizer to count prompts with")
        return hub.cached_snapshot(self.settings.hf_cache_dir, model.repo, model.revision)

    async def _serve_gateway(self) -> asyncio.Server:
        """The agent-facing OpenAI endpoint (SPARKCTL_GATEWAY_HOST:PORT, loopback by default)."""
        s = self.settings
        handed = process.handed_socket()
        try:
            server = await self.gateway.serve(s.gateway_host, s.gateway_port, sock=handed)
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise SparkctlError(f"the gateway cannot listen on {s.gateway_url}: {e.strerror}; set "
                                    "SPARKCTL_GATEWAY_HOST to an address of this machine") from None
            who = processes.who_holds(s.gateway_port)
            raise SparkctlError(f"the gateway cannot listen on {s.gateway_url}: {who} already listens on port "
                                f"{s.gateway_port}; stop it, or set SPARKCTL_GATEWAY_PORT to a free port") from None
        log.info("gateway_listening", address=str(handed.getsockname() if handed else (s.gateway_host, s.gateway_port)),
                 max_connections=self.limits.connections, socket="handed over by systemd" if handed else "own")
        asyncio.get_running_loop().create_task(self._report_refusals(self.limits))
        return server

    async def _wake_on_demand(self, stack: str) -> str | None:
        """A parked stack a request named, woken; None once it serves."""
        try:
            await self.actions.parking.wake_on_demand(stack)
        except Exception as e:  # noqa: BLE001 - the held requests get the reason, the daemon goes on
            reason = str(e).splitlines()[0] if isinstance(e, SparkctlError) else f"{type(e).__name__}: {e}"
            log.warning("wake_on_demand_failed", stack=stack, error=reason[:300])
            return f"waking {stack} failed: {reason}"
        return None

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
        app = api.build(self.actions, self.reads, token=s.api_token.get_secret_value(), follows=self.follows,
                        underway=self.underway)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host.strip("[]"), int(port)).start()
        log.info("daemon_listening_tcp", address=s.api_tcp)
        return runner

    async def serve(self) -> None:
        lock = process.exclusive(self.settings.lock_path)  # held until the process ends
        loop = asyncio.get_running_loop()
        seam.install(loop)
        await self._recover()
        process.freeze_startup()
        path = self.settings.socket_path
        path.unlink(missing_ok=True)  # a dead daemon's: a live one would hold the lock
        gateway, gateway_server = self.gateway, await self._serve_gateway()  # before the API: a switch needs it
        runner = web.AppRunner(api.build(self.actions, self.reads, follows=self.follows, underway=self.underway),
                               access_log=None)
        await runner.setup()
        old = os.umask(0o177)  # the socket is born 0600: no window with looser permissions
        try:
            await web.UnixSite(runner, str(path)).start()
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        log.info("daemon_listening", socket=str(path), pid=os.getpid())
        tcp = await self._serve_tcp()
        process.notify_ready()
        loop.run_in_executor(None, hub.load)  # the Hub client, loaded before a first `up` needs it
        self.loops.start()
        sampling = asyncio.create_task(self.recorder.run())
        watching = asyncio.create_task(self.sentinel.run()) if self.settings.sentinel else None
        if self.fleet_watch is not None:
            self.fleet_watch.start()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        gone = asyncio.create_task(process.stop_when_gone(lock, stop.set))
        await stop.wait()
        gone.cancel()
        log.info("daemon_stopping", note="engine containers keep running")
        self.fetches.stop_all()
        faulthandler.dump_traceback_later(SLOW_STOP)  # what holds a slow stop up, for its bug report
        gateway_server.close()  # new connections wait in the socket's queue when systemd holds it
        if not await gateway.finish(timeout=self.settings.switch_drain_timeout):
            log.warning("gateway_requests_cut", note="in-flight requests outlived the drain timeout")
        if self.fleet_watch is not None:
            self.fleet_watch.stop()
        sampling.cancel()
        await asyncio.gather(sampling, return_exceptions=True)
        if watching is not None:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            self.sentinel.stopped()
        await self.loops.stop()
        await runner.cleanup()
        gateway.close()
        if tcp is not None:
            await tcp.cleanup()
        await self.reconciler.close()
        path.unlink(missing_ok=True)
        lock.close()
        log.info("daemon_stopped")


async def run(settings: Settings) -> None:
    """Make the daemon inside the event loop it serves on, and serve until SIGTERM/SIGINT."""
    await Daemon(settings).serve()


def _fleetwide(settings: Settings) -> Fleetwide | None:
    """The fleet this Spark heads (`sparkctl fleet init`), if it heads one: the daemon then owns
    its placement book (read here once, written through), places and removes stacks across it,
    watches its hosts and switches to stacks placed across it."""
    record = local.read_record(settings.fleet_dir / local.RECORD_FILE)
    if record is None or not record.is_head:
        return None
    inventory = load_fleet(settings.fleet_path) if settings.fleet_path.exists() else None
    return Fleetwide(membership.control_plane(settings), settings, inventory, record.head,
                     placement.Book(PlacementFile(settings.fleet_dir)))
