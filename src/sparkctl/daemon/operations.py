"""What the daemon does when asked: up, down, switch, park, wake, retest, status, history and metrics. The API's
handlers call these on a worker thread (through the `Service` protocol in `api.py`); each
action on a stack runs in its turn (`turns.py`), marked busy so reconcile passes leave it alone.
Results are returned as values; the store only records them."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkctl.adapters.docker import DockerEngine
from sparkctl.adapters.sleepmode import SleepMode
from sparkctl.bench import metrics
from sparkctl.daemon import planner
from sparkctl.daemon.events import BusReporter, EventBus
from sparkctl.daemon.machine import DockerMachine, Woken
from sparkctl.daemon.metrics import DaemonMetrics
from sparkctl.daemon.reconciler import Reconciler
from sparkctl.daemon.switch import GatewayControl, Switcher
from sparkctl.daemon.turns import Turns
from sparkctl.daemon.verdicts import Verdicts
from sparkctl.deploy import retest
from sparkctl.deploy.memory import MemoryView
from sparkctl.deploy.status import other_instances, status_rows
from sparkctl.errors import ImageRefused, NoSuchFile, SparkctlError
from sparkctl.fleet import placement
from sparkctl.fleet.placement import Placed
from sparkctl.gateway.routes import RouteTable, Upstream, build_table
from sparkctl.policy import routing
from sparkctl.policy.images import ImagePolicy
from sparkctl.policy.parking import Park, choose
from sparkctl.policy.switch import Leaving, plan_switch
from sparkctl.settings import Settings
from sparkctl.spec import imagefile, listing
from sparkctl.spec.load import Catalog
from sparkctl.spec.models import Kind, Stack
from sparkctl.state.desired import Desired
from sparkctl.state.store import Store
from sparkctl.wire import DownDone, Note, UpDone

if TYPE_CHECKING:
    from sparkctl.daemon.fleetswitch import FleetSwitch


REPORT_KINDS = {"reports": "comparison.md", "bench": "agent.md"}  # state-dir folder -> its reports' page


ENGINE_COUNTERS = {"generated": "vllm:generation_tokens_total", "ttft_sum": "vllm:time_to_first_token_seconds_sum",
                   "ttft_count": "vllm:time_to_first_token_seconds_count"}


def engine_counters(url: str, headers: list[tuple[str, str]] | None = None) -> dict[str, float] | None:
    """An engine's /metrics counters (None: it did not answer within a second)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url + "/metrics", headers=dict(headers or [])),
                                    timeout=1) as page:
            return metrics.parse(page.read().decode(errors="replace"))
    except (OSError, ValueError):
        return None


def report_file(state_dir: Path, report: str, path: str) -> Path:
    """A file of a written report (`report`: `reports/<name>` or `bench/<name>`, a folder holding its
    page); NoSuchFile for anything else, a path that leaves the folder (`..`, a link) included."""
    kind, _, name = report.partition("/")
    base = (state_dir / kind).resolve()
    root = (base / name).resolve()
    wanted = (root / path).resolve()
    if kind not in REPORT_KINDS or root.parent != base or not (root / REPORT_KINDS[kind]).is_file() \
            or not wanted.is_relative_to(root) or not wanted.is_file():
        raise NoSuchFile(f"no file {path!r} in report {report!r}")
    return wanted


@dataclass
class Routes:
    """What the gateway routes to: running containers whose deployment passed its health checks
    (a failed redeploy leaves the previous, healthy one routed; one still loading is not), and
    the stacks placed across the fleet, at their replicas' URLs as the book has them."""

    docker: DockerEngine
    store: Store
    catalog: Callable[[], Catalog]
    desired: Callable[[], Desired]
    placed: Callable[[], dict[str, Placed]] = dict
    engine_auth: Callable[[], str] = lambda: ""  # what placed engines' relays ask for (`membership.relay_auth`)
    table: RouteTable = field(default_factory=RouteTable)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # a rebuild from older reads must not land last

    def refresh(self) -> None:
        with self._lock:
            desired = self.desired()
            running = {c.stack for c in self.docker.containers() if c.running and not c.placed
                       and c.stack not in desired.parked
                       and c.fingerprint in self.store.deployments.healthy_fingerprints(c.stack)}
            stacks = {s.name: upstream_of(s) for s in self.catalog().deployable()}
            placed = self.placed()
            serving = placement.serving(placed)
            auth = self.engine_auth() if serving else None
            for name, entry in serving.items():
                if name in stacks and entry.replicas:
                    first, *others = (r.url for r in entry.replicas)
                    stacks[name] = dataclasses.replace(stacks[name], url=first, replicas=tuple(others), placed=True,
                                                       auth=auth)
                    running.add(name)
            self.table = build_table(aliases=desired.aliases, stacks=stacks, running=running,
                                     parked=set(desired.parked) | {n for n, e in placed.items() if e.parked},
                                     routes=desired.routes)


def upstream_of(stack: Stack) -> Upstream:
    """What the gateway needs of a stack: where it listens, its served name, its enforced
    concurrency cap (known issues with a source or `enforce: true`) and its request defaults."""
    return Upstream(stack.name, stack.url, stack.served_name, stack.max_concurrency, stack.request_defaults)


@dataclass
class Operations:
    settings: Settings
    machine: DockerMachine
    reconciler: Reconciler
    routes: Routes
    bus: EventBus
    kick: Callable[[], None]  # ask the reconcile loop for a pass
    metrics: DaemonMetrics = field(default_factory=DaemonMetrics)
    gateway: GatewayControl | None = None  # set once the gateway listens; a switch needs it
    # When each stack last came up or woke (monotonic): its idle time counts from there at least.
    serving_since: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    # Held from a memory decision (switch, park, wake) until it is carried out, so two of them
    # never both count on the same free memory. Taken before any stack's turn, never after.
    memory_lock: threading.RLock = field(default_factory=threading.RLock)
    fleet: FleetSwitch | None = None  # on a fleet's head: switches to stacks placed across it

    @property
    def store(self) -> Store:
        return self.machine.store

    @property
    def turns(self) -> Turns:
        return self.machine.turns

    def check_stack(self, name: str) -> str:
        return self.machine.catalog().stack(name).name

    def desired(self) -> Desired:
        return self.machine.desired()

    def up(self, stack: str, *, refresh: bool = False, replace: bool = False, ticket: int | None = None
           ) -> UpDone:
        started = time.time()
        if stack in self.machine.desired().parked:  # `up` wants it serving: wake it (in its turn), then confirm it
            self.wake(stack, ticket=ticket)
            ticket = None
        with self.turns.turn(stack, ticket):
            was_desired = stack in self.machine.desired().stacks
            self.machine.update_desired(lambda d: d.with_stack(stack))
            self.reconciler.forget(stack)
            result = None
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
                if result is None or result.changed or not was_desired:  # else routes and Docker are as they were
                    self.routes.refresh()
                    self.kick()
        if result is None:
            raise SparkctlError(f"{stack} was taken down while it was being deployed")
        self.metrics.outcome(stack, ok=True)
        self.metrics.phase("deploy", time.time() - started)
        self.serving_since[stack] = time.monotonic()
        return UpDone(stack, result.fingerprint, unchanged=not result.changed)

    def down(self, stack: str, *, ticket: int | None = None) -> DownDone:
        with self.turns.turn(stack, ticket):
            self.machine.update_desired(lambda d: d.without_stack(stack))
            with self.reconciler.holding(stack):
                removed = self.machine.down(stack)
        self.kick()
        return DownDone(stack, removed)

    def switch(self, alias: str, stack: str, *, ticket: int | None = None) -> dict[str, Any]:
        """Move `alias` to `stack` (blue/green or hold/swap); rolled back on any failure."""
        with self.turns.turn(f"alias:{alias}", ticket), self.memory_lock:  # one switch of an alias at a time
            spec = self.machine.catalog().stack(stack)
            if rules := self.machine.desired().routes.get(alias):
                raise SparkctlError(f"{alias} is routed by prompt length ({'; '.join(r.describe() for r in rules)}): "
                                    f"change its rules with `sparkctl route set {alias} ...`, or `sparkctl route rm "
                                    f"{alias}` and switch it then")
            if self.fleet is not None and self.fleet.applies(spec):
                assert self.gateway is not None, "the gateway starts before the API"
                return self.fleet.run(alias, spec, self.gateway)
            if self.machine.desired().aliases.get(alias) == spec.name:  # as `up` does: make sure, change nothing
                return {"alias": alias, "stack": spec.name, "mode": "unchanged", "timings": {},
                        "up": asdict(self.up(spec.name))}
            desired, view = self.machine.desired(), self.memory()
            old, memory = desired.aliases.get(alias), view.now(desired.parked)
            leaving = Leaving()
            if old in self.machine.catalog().stacks and old in memory.held and old not in memory.parked:
                old_spec = self.machine.catalog().stack(old)
                leaving = Leaving(old_spec.switch.park, view.footprint(old), self.cannot_sleep(old_spec))
            # a stack a routed alias names is still named: the switch leaves it running
            named = desired.aliases | {f"{a}[{i}]": r.stack for a, rules in desired.routes.items()
                                       for i, r in enumerate(rules)}
            plan = plan_switch(alias, spec.name, footprint=view.footprint(spec.name), aliases=named,
                               memory=memory, leaving=leaving)
            assert self.gateway is not None, "the gateway starts before the API"
            self.reconciler.forget(spec.name)
            verdicts = Verdicts(self.settings, self.store, self.bus, lambda name: self.machine.catalog().stack(name),
                                self.machine.docker)
            switcher = Switcher(machine=self.machine, reconciler=self.reconciler, gateway=self.gateway,
                                refresh_routes=self.routes.refresh, store=self.store, reporter=BusReporter(self.bus),
                                bench=verdicts.bench, blame=verdicts.blame, woke=self._record_wake,
                                bench_mode=lambda s: self.machine.catalog().stack(s).switch.bench)
            try:
                return switcher.run(plan)
            finally:
                self.serving_since[spec.name] = time.monotonic()
                self.kick()

    def route(self, alias: str, rules: str, *, ticket: int | None = None) -> dict[str, Any]:
        """Route `alias` by prompt length (`rules`: `STACK:TOKENS ... STACK`), or, with no rules,
        make it unrouted. Every stack it names must be up or parked: the gateway may send a
        request to any of them at once."""
        with self.turns.turn(f"alias:{alias}", ticket):
            parsed = routing.check(alias, [routing.parse(r) for r in rules.split()]) if rules.strip() else None
            catalog, desired = self.machine.catalog(), self.machine.desired()
            memory, serving = 0.0, {}
            for rule in parsed or ():
                spec = catalog.stack(rule.stack)
                placed = self.fleet is not None and self.fleet.placed(rule.stack)
                if rule.stack not in desired.stacks and not placed:
                    raise SparkctlError(f"routed alias {alias}: {rule.stack} is neither up nor parked, and the gateway "
                                        f"may send it a request at any time; `sparkctl up {rule.stack}` first")
                memory += 0.0 if placed else spec.resources.gpu_memory_utilization
                serving[rule.stack] = self._serving(spec)
            fits = routing.fit(parsed or (), serving)
            self.machine.update_desired(lambda d: d.routed(alias, parsed))
            self.routes.refresh()
        if parsed is None:
            return {"alias": alias, "rules": None}
        return {"alias": alias, "rules": [dataclasses.asdict(r) for r in parsed], "memory": round(memory, 3),
                "ceiling": self.settings.memory_ceiling, "fit": fits}

    def _serving(self, spec: Stack) -> routing.Serving:
        """The context a stack serves and its KV cache, as its last deploy recorded them (else its spec)."""
        latest = self.store.deployments.latest(spec.name)
        headroom = latest and latest.fingerprint and self.store.deployments.headroom(spec.name, latest.fingerprint)
        configured = spec.vllm.max_model_len if spec.vllm else None
        if not headroom:
            return routing.Serving(configured)
        return routing.Serving(headroom.max_model_len or configured, headroom.kv_tokens)

    def park(self, stack: str, *, how: Park = Park.AUTO, ticket: int | None = None,
             still: Callable[[], bool] = lambda: True) -> dict[str, Any]:
        """Put a running stack to sleep (or stop it) as deep as `how` and the memory allow; its
        requests drain first. `still`: checked once in the stack's turn (an idle park that a
        request or a switch overtook does nothing)."""
        if self.fleet is not None and self.fleet.placed(stack):
            with self.turns.turn(stack, ticket):
                return self.fleet.park(stack, self.quiesce)
        with self.memory_lock, self.turns.turn(stack, ticket):
            spec, desired = self.machine.catalog().stack(stack), self.machine.desired()
            if stack in desired.parked or not still():
                return {"stack": stack, "park": "unchanged", "why": f"{stack} is parked already or in use"}
            view = self.memory()
            memory = view.now(desired.parked)
            if stack not in desired.stacks or stack not in memory.held:
                raise SparkctlError(f"{stack} is not running as a desired stack; nothing to park")
            beside = memory.beside(stack)
            choice = choose(how, view.footprint(stack), beside=beside, after=beside, ceiling=memory.ceiling,
                            unable=self.cannot_sleep(spec))
            with self.reconciler.holding(stack):
                self.machine.park(stack, choice.park.level, before=lambda: self.quiesce(stack))
            self.routes.refresh()
            return {"stack": stack, "park": str(choice.park), "why": choice.why}

    def quiesce(self, stack: str) -> None:
        """Before a stack sleeps: the gateway stops routing to it (its names now wake it) and its
        accepted requests finish."""
        self.routes.refresh()
        if self.gateway is not None:
            self.gateway.drain(stack)

    def wake(self, stack: str, *, ticket: int | None = None) -> dict[str, Any]:
        """Wake a parked stack, if its wake peak fits beside what runs."""
        if self.fleet is not None and self.fleet.placed(stack):
            with self.turns.turn(stack, ticket):
                return self.fleet.wake(stack)
        with self.memory_lock, self.turns.turn(stack, ticket):
            desired = self.machine.desired()
            if stack not in desired.parked:
                raise SparkctlError(f"{stack} is not parked")
            view = self.memory()
            memory, level = view.now(desired.parked), desired.parked[stack]
            peak = memory.beside(stack) + view.footprint(stack).peak(level)
            if peak > memory.ceiling + 1e-9:
                raise SparkctlError(f"{stack} does not fit: waking it from level {level} would hold {peak:.2f} of "
                                    f"memory at its peak, over the ceiling {memory.ceiling:.2f}; park or stop "
                                    "another stack first")
            try:
                with self.reconciler.holding(stack):
                    woken = self.machine.wake(stack)
            finally:
                self.routes.refresh()
            self.serving_since[stack] = time.monotonic()
            self._record_wake(stack, woken)
            return {"stack": stack} | asdict(woken)

    def settle_parked(self) -> list[str]:
        """After a restart, `GET /is_sleeping` is the truth: a stack recorded parked that is awake
        (the daemon was killed mid-park or mid-wake) is parked again, before anything else wakes."""
        done = []
        desired = self.machine.desired()
        running = {c.stack for c in self.machine.docker.containers() if c.running}
        for stack, level in desired.parked.items():
            if not level or stack not in running or stack not in self.machine.catalog().stacks:
                continue
            try:
                if not SleepMode(self.machine.catalog().stack(stack).url).sleeping():
                    self.machine.park(stack, level)
                    done.append(f"{stack} was awake though recorded parked: parked again at level {level}")
            except SparkctlError as e:
                done.append(f"{stack} is recorded parked, but its engine did not answer ({e}); stopping it")
                try:
                    self.machine.park(stack, 0)
                except SparkctlError as again:
                    done.append(f"{stack} could not be stopped either: {again}")
        return done

    def park_idle(self, quiet_since: Callable[[str], float | None]) -> None:
        """Park each stack whose `switch.idle_park` went by without a request through the gateway
        (`quiet_since`: when its last one finished, None while it has some). Called after each
        reconcile pass."""
        catalog, desired = self.machine.catalog(), self.machine.desired()
        for c in self.machine.docker.containers():
            spec = catalog.stacks.get(c.stack)
            if not c.running or c.stack in desired.parked or spec is None or spec.switch.idle_park is None:
                continue
            def idle(stack: str = c.stack, ttl: float = spec.switch.idle_park) -> bool:
                quiet = quiet_since(stack)
                busy = self.reconciler.history.get(stack, planner.History()).busy
                since = max(quiet or 0.0, self.serving_since.get(stack, self.started))
                return quiet is not None and not busy and time.monotonic() - since >= ttl

            if idle():
                try:
                    self.park(c.stack, how=spec.switch.park, still=idle)  # checked again in its turn
                except SparkctlError as e:
                    self.bus.publish(Note(c.stack, f"{c.stack} was idle but did not park: {e}"))

    def wake_on_demand(self, stack: str) -> None:
        """A request named the parked stack (the gateway holds it meanwhile)."""
        if stack in self.machine.desired().parked or (self.fleet is not None and self.fleet.parked(stack)):
            self.wake(stack)
        else:  # woken meanwhile (a switch, `up`): the routes may not say so yet
            self.routes.refresh()

    def memory(self) -> MemoryView:
        return MemoryView(self.settings, self.store, self.machine.catalog(), self.machine.docker)

    def cannot_sleep(self, stack: Stack) -> str | None:
        """Why the stack's engine cannot be parked with sleep mode, if it cannot."""
        if stack.kind is Kind.COMPOSE:
            return "stop: a compose project's engine is not run by sparkctl, so it does not sleep"
        if not stack.sleeps:
            return "stop: switch.park is stop, so its engine runs without sleep mode"
        latest = self.store.deployments.latest(stack.name)
        refused = imagefile.policy_for(self.settings).wake_refused(latest.parts.get("image") if latest else None)
        if refused:
            return f"stop: {refused}"
        try:
            available = SleepMode(stack.url).available()
        except SparkctlError as e:
            return f"stop: its engine did not answer ({str(e).splitlines()[0]})"
        if not available:
            return ("stop: the engine has no sleep-mode endpoints (GET /is_sleeping: 404): its platform has no "
                    "sleep mode (vLLM's CPU backend has none) or it runs without VLLM_SERVER_DEV_MODE=1")
        return None

    def _record_wake(self, stack: str, woken: Woken) -> None:
        """The first watched wake of an image digest goes into images.yaml; a failed one always."""
        latest = self.store.deployments.latest(stack)
        digest = latest.parts.get("image") if latest else None
        if not digest or not woken.level:
            return
        known = imagefile.policy_for(self.settings).wakes.get(digest)
        if woken.killed or known is None:
            try:
                imagefile.record_wake(self.settings.images_file, digest, ok=not woken.killed,
                                      reason=woken.killed or "")
            except (SparkctlError, OSError) as e:  # the wake stands; the ledger learns next time
                self.bus.publish(Note(stack, f"could not record how {digest} woke in images.yaml: {e}"))

    def retest_target(self, ref: str, stack: str) -> tuple[str, str]:
        """The trial a retest of `ref` runs and the stack it measures with (before the action streams)."""
        chosen = retest.choose_stack(self.machine.catalog(), ref, stack or None).name
        return retest.trial_name(chosen), chosen

    def retest(self, ref: str, *, stack: str, force: bool = False, ticket: int | None = None) -> dict[str, Any]:
        """Measure what a blacklisted tag names now, as a trial of `stack` that no pass touches
        (`deploy/retest.py`): the ban lifted on a pass, kept with the measurement on a failure."""
        with self.turns.turn("retest:", ticket):  # one at a time (no stack name has a colon)
            deployer = self.machine.deployer()
            trial = retest.prepare(ref, stack=stack, force=force, deployer=deployer)
            with self.reconciler.holding(trial.spec.name):
                return retest.run(trial, deployer).as_dict()

    def status(self) -> dict[str, Any]:
        """The CLI's status rows, plus desired stacks without a container and failure marks."""
        desired, catalog, policy = self.machine.desired(), self.machine.catalog(), imagefile.policy_for(self.settings)
        rows = status_rows(self.machine.docker, self.store, catalog)
        seen = {r["stack"] for r in rows}
        history = self.reconciler.history
        rows += [{"stack": s, "phase": "failed" if history.get(s, planner.History()).failed else "pending",
                  "state": "absent", "endpoint": "", "fingerprint": None, "container": "", "uptime_s": None,
                  "memory": None, "error": None, "kv": None} for s in desired.stacks if s not in seen]
        restarts = Counter(e["stack"] for e in self.store.events.list(limit=10_000) if e["kind"] == "restarted")
        for row in rows:
            h = history.get(row["stack"], planner.History())
            row |= {"desired": row["stack"] in desired.stacks, "failed": h.failed, "recent_failures": len(h.failures),
                    "parked": desired.parked.get(row["stack"]), "restarts": restarts[row["stack"]],
                    "acceptance": self._acceptance(row["stack"], catalog) if row["state"] == "running" else None,
                    **self._image(row["stack"], catalog, policy)}
            if row["parked"] is not None:
                row["phase"] = f"parked (sleep level {row['parked']})" if row["parked"] else "parked (stopped)"
        memory = self.memory().now(desired.parked)
        return {"stacks": rows, "aliases": desired.aliases, "pid": os.getpid(), "instance": self.settings.instance,
                "others": other_instances(self.machine.docker),
                "memory": {"held": memory.held, "ceiling": memory.ceiling, "parked": memory.parked},
                "catalog": sorted(s.name for s in catalog.deployable())}

    def stacks(self) -> dict[str, Any]:
        """`sparkctl stacks list`'s rows, from the catalog and policy as the files are now."""
        return {"stacks": listing.rows(self.machine.catalog(), imagefile.policy_for(self.settings))}

    def _image(self, stack: str, catalog: Catalog, policy: ImagePolicy) -> dict[str, Any]:
        """A stack's image as written, the digest its last deploy ran, and the policy's verdict on it."""
        try:
            image = catalog.stack(stack).image
        except SparkctlError:
            return {}
        latest = self.store.deployments.latest(stack)
        digest = latest.parts.get("image") if latest else None
        pin = policy.pin_for(image.ref)
        if (ban := policy.ban_for(image.ref, digest)) is not None:
            verdict = f"blacklisted: {ban[1].reason}"
        elif pin is not None and pin.known_good:
            verdict = "known-good"
        else:
            verdict = "pinned" if pin is not None else "unpinned"
        return {"image": image.ref, "digest": digest, "verdict": verdict}

    @staticmethod
    def _acceptance(stack: str, catalog: Catalog) -> float | None:
        """The engine's speculative acceptance since it started, from its /metrics (None: no speculation)."""
        try:
            counters = engine_counters(catalog.stack(stack).url)
        except SparkctlError:
            return None
        return metrics.between({}, counters).acceptance if counters is not None else None

    def engines(self) -> dict[str, Any]:
        """Each routed stack's engine counters as they stand (generated tokens, time to first token's
        sum and count): the dashboard turns two readings into tokens/s and TTFT."""
        found = {}
        for stack, upstream in self.routes.table.upstreams.items():
            if (counters := engine_counters(upstream.url, upstream.headers)) is not None:
                found[stack] = {key: counters.get(name, 0.0) for key, name in ENGINE_COUNTERS.items()}
        return {"at": time.time(), "engines": found}

    def history(self, stack: str | None) -> dict[str, Any]:
        store = self.store
        deployments = [{"id": d.id, "stack": d.stack, "phase": d.phase.value, "fingerprint": d.fingerprint,
                        "started": d.started, "finished": d.finished, "error": d.error,
                        "transitions": [(p.value, at, detail) for p, at, detail in store.deployments.transitions(d.id)]}
                       for d in store.deployments.history(stack)]
        bans = [{"ref": ref, "reason": ban.reason, "date": ban.date.isoformat() if ban.date else None}
                for ref, ban in imagefile.policy_for(self.settings).blacklist.items()]
        return {"deployments": deployments, "events": store.events.list(stack), "switches": store.switches.list(),
                "bans": bans}

    def runs(self) -> dict[str, Any]:
        """The stored benchmark runs with results, newest first (the dashboard's Compare picks from them)."""
        return {"runs": [{"id": r.id, "stack": r.stack, "profile": r.profile, "started": r.started,
                          "verdict": r.verdict, "rows": len(r.rows)}
                         for r in self.store.bench.runs(limit=200) if r.rows]}

    def reports(self) -> dict[str, Any]:
        """The written reports, newest first: comparisons (`reports/<time>`) and agent sessions
        (`bench/agent-<time>`), each with its markdown file."""
        found = [{"id": f"{kind}/{folder.name}", "file": page, "time": folder.stat().st_mtime}
                 for kind, page in REPORT_KINDS.items() for folder in (self.settings.state_dir / kind).glob("*")
                 if (folder / page).is_file()]
        return {"reports": sorted(found, key=lambda r: -r["time"])}

    def report_file(self, report: str, path: str) -> Path:
        return report_file(self.settings.state_dir, report, path)

    def compare(self, runs: list[int], label: str = "") -> dict[str, Any]:
        """A comparison report of these benchmark runs, written as `sparkctl bench report` writes it."""
        from sparkctl import report
        from sparkctl.deploy.retest import reported_spec

        found = [self.store.bench.run(i) for i in runs]
        if not found or None in found:
            raise SparkctlError(f"no such benchmark runs among {runs}; `sparkctl bench list` shows them")
        catalog, folder = self.machine.catalog(), self.settings.state_dir / "reports" / time.strftime("%Y%m%d-%H%M%S")
        report.compare([(reported_spec(catalog, run.stack), run) for run in found], folder,
                       blacklist=imagefile.policy_for(self.settings).blacklist,
                       bandwidth_gbs=self.settings.memory_bandwidth_gbs, label=label)
        return {"id": f"reports/{folder.name}", "file": report.REPORT}

    def logs(self, stack: str, tail: int) -> Any:
        """A stack's engine log as docker streams it (its last `tail` lines, then following); `close()` ends it."""
        found = self.machine.docker.containers(self.check_stack(stack))
        if not found:
            raise SparkctlError(f"{stack} has no container; `sparkctl status` lists what runs")
        return self.machine.docker.log_stream(found[0].id, tail=tail)

    def metrics_text(self) -> str:
        states = {o.stack: o.state for o in self.machine.observe()}
        states |= {s: "failed" for s, h in self.reconciler.history.items() if h.failed}
        return self.metrics.render(passes=self.reconciler.passes, restarts=self.reconciler.restarts, states=states)
