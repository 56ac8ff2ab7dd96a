"""`sparkctl switch [ALIAS] STACK`: move an alias to another stack without failing the agent; and
`sparkctl route`: an alias routed by prompt length. One flow in one module: `Aliases` is the
action (the stack's machine chosen once: this Spark's `Switcher` below, or the fleet's), the
plan is pure (`policy/switch.py`).

The mode comes from the pure plan (`policy/switch.py`). Blue/green: deploy (or wake) the new
stack (full pipeline: health, canary), optionally gate on its quick benchmark, flip the alias,
drain the old stack's requests, park or remove it. Hold/swap: hold the alias's new requests at
the gateway, drain, park or stop (not remove) the old stack, deploy or wake the new one, gate,
flip, release the queue in order. A parked stack stays desired: switching back wakes it.

Any failure rolls back: the new stack is removed, the old one is kept, started or woken again,
the alias keeps naming it and the queue is released to it. Each switch is recorded with its
timings. A coroutine on the daemon's loop: the gateway is called directly, each blocking step
on a stack goes through the seam in that stack's turn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import structlog

from sparkctl.daemon.actions.deploys import Deploys
from sparkctl.daemon.actions.parking import Parking
from sparkctl.daemon.machine import DockerMachine
from sparkctl.daemon.reconciler import Reconciler
from sparkctl.daemon.routes import Routes
from sparkctl.daemon.seam import blocking
from sparkctl.daemon.sleeper import Sleeper
from sparkctl.daemon.turns import Turns
from sparkctl.deploy.launch import Staged
from sparkctl.deploy.memory import MemoryView
from sparkctl.deploy.progress import Reporter
from sparkctl.errors import SparkctlError
from sparkctl.gateway.proxy import Gateway
from sparkctl.messages import RouteDone, RouteRule, SwitchDone, WakeDone
from sparkctl.policy import routing
from sparkctl.policy.parking import Park
from sparkctl.policy.switch import Leaving, Mode, SwitchPlan, plan_switch
from sparkctl.settings import Settings
from sparkctl.spec.load import Catalog
from sparkctl.spec.models import Stack
from sparkctl.state.desired import DesiredFile
from sparkctl.state.store import Store

if TYPE_CHECKING:
    from sparkctl.daemon.actions.machines import Machines

log = structlog.get_logger()


class SwitchFailed(SparkctlError):
    """The switch was rolled back; the message says why and what runs now."""


@dataclass
class Switch:
    """One switch in progress: its plan and what it measured."""

    plan: SwitchPlan
    new_was_desired: bool  # then a rollback leaves the new stack as it was
    timings: dict[str, float] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Time the block into `timings[name]` (seconds), also when it raises."""
        start = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = round(time.monotonic() - start, 3)


@dataclass
class Switcher:
    machine: DockerMachine
    sleeper: Sleeper
    desired: DesiredFile
    reconciler: Reconciler
    turns: Turns
    gateway: Gateway
    refresh_routes: Callable[[], None]
    store: Store
    reporter: Reporter
    bench: Callable[[str], dict[str, Any]]  # the quick benchmark of a stack; raises if it fails its gate
    bench_mode: Callable[[str], str]  # "gate", "after" or "off", from the stack's spec
    blame: Callable[[str, Exception], str | None] = lambda stack, cause: None  # e.g. blacklist its digest
    woke: Callable[[str, WakeDone], None] = lambda stack, woken: None  # e.g. record how its digest wakes

    async def run(self, plan: SwitchPlan) -> SwitchDone:
        switch = Switch(plan, new_was_desired=plan.new in (await blocking(self.desired.read)).stacks)
        started = time.time()
        self._note(plan, f"switching {plan.alias}: {plan.old or '(nothing)'} -> {plan.new} ({plan.mode}; {plan.why})")
        intent = {"alias": plan.alias, "from": plan.old, "to": plan.new, "mode": str(plan.mode),
                  "stop_old": plan.stop_old, "new_was_desired": switch.new_was_desired, "park": str(plan.park),
                  "wake": plan.wake, "evict": list(plan.evict), "why": plan.why}
        # A daemon killed mid-way finishes or undoes it on start.
        switch_id = await blocking(self.store.switches.begin, intent)
        error = None
        try:
            with ExitStack() as busy:  # the reconciler leaves both stacks alone meanwhile
                for stack in filter(None, (plan.old, plan.new)):
                    busy.enter_context(self.reconciler.holding(stack))
                for stack in plan.evict:  # parked already: stopping it changes no route
                    await self._park(stack, 0, quiesce=False)
                if plan.mode is Mode.BLUE_GREEN:
                    await self._blue_green(switch)
                else:
                    await self._hold_swap(switch)
        except SparkctlError as e:
            error = str(e)
        switch.timings["total_s"] = round(time.time() - started, 3)
        record = intent | {"ok": error is None, "error": error, "timings": switch.timings, **switch.facts}
        await blocking(self.store.switches.finish, switch_id, record)
        log.info("switch_finished", **{k: v for k, v in record.items() if k != "timings"}, **switch.timings)
        if error is not None:
            raise SwitchFailed(error)
        if self.bench_mode(plan.new) == "after":
            switch.facts["bench"] = await self._bench_after(plan.new)
        woken = switch.facts.get("woken")
        return SwitchDone(plan.alias, plan.new, str(plan.mode), previous=plan.old, why=plan.why,
                          timings=dict(switch.timings), park=str(plan.park),
                          held_requests=switch.facts.get("held_requests"), bench=switch.facts.get("bench"),
                          woken=WakeDone(**woken) if woken else None)

    # --- the two modes ------------------------------------------------------------------------
    async def _blue_green(self, switch: Switch) -> None:
        plan = switch.plan
        try:
            await self._bring_up(switch)
        except Exception as e:  # noqa: BLE001 - whatever failed, the old stack keeps the alias
            if not switch.new_was_desired:
                await self._remove(plan.new)
            raise await self._rolled_back(plan, e) from None
        await self._flip(switch)
        if plan.old and plan.stop_old and plan.old not in (await blocking(self.desired.read)).parked:
            with switch.timed("drain_s"):
                switch.facts["drained"] = await self.gateway.drain(plan.old)
            if plan.park is Park.STOP:
                with switch.timed("stop_old_s"):
                    await self._retire(switch, plan.old)
            else:
                try:
                    with switch.timed("park_old_s"):
                        await self._park(plan.old, plan.park.level)
                except SparkctlError as e:  # the switch stands: the old stack goes as a stopped one would
                    switch.facts["park_error"] = str(e)
                    await self._retire(switch, plan.old)

    async def _hold_swap(self, switch: Switch) -> None:
        plan = switch.plan
        assert plan.old is not None
        staged = await self._stage(switch)
        self.gateway.hold(plan.alias, plan.old, plan.new)
        released = False
        try:
            with switch.timed("drain_s"):
                switch.facts["drained"] = await self.gateway.drain(plan.old)
            try:
                stopped = await self._leave(switch)
            except Exception as e:  # noqa: BLE001 - it still serves: only the staged container to undo
                if staged is not None:
                    await self._step(staged.stack, self.machine.discard, staged,
                                     f"not started: the switch was rolled back ({e})")
                await blocking(self.refresh_routes)
                raise await self._rolled_back(plan, e) from None
            try:
                await self._bring_up(switch, staged)
            except Exception as e:  # noqa: BLE001 - whatever failed, the stopped old stack starts again
                if switch.new_was_desired:  # e.g. a parked stack that failed to wake: kept, stopped
                    await self._park(plan.new, 0, quiesce=False)
                else:
                    await self._remove(plan.new)
                with switch.timed("restart_old_s"):
                    if plan.park is Park.STOP:
                        for container in stopped:
                            await self._step(plan.old, self.machine.start, container)
                    else:
                        await self._step(plan.old, self.sleeper.wake, plan.old)
                await blocking(self.refresh_routes)
                raise await self._rolled_back(plan, e) from None
            await self._flip(switch)
            switch.facts |= self.gateway.release(plan.alias)
            released = True
            if plan.park is Park.STOP:
                await self._retire(switch, plan.old)
        finally:
            if not released:
                switch.facts |= self.gateway.release(plan.alias)

    # --- steps --------------------------------------------------------------------------------
    async def _step(self, stack: str, work: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A blocking step on `stack`, in its turn, on a worker."""
        async with self.turns.turn(stack):
            return await blocking(work, *args, **kwargs)

    async def _stage(self, switch: Switch) -> Staged | None:
        """Before the hold, while the old stack still serves: the new stack's preparation and its
        container, created, so that the hold is left with the old one's stop and the new one's
        admission, start and health. Only for a stack that is not desired yet: if the daemon is
        killed now, the container is one the reconciler removes, never one it starts."""
        if switch.new_was_desired:  # parked (it wakes), or kept by the desired set: the whole pipeline
            return None
        try:
            with switch.timed("stage_s"):
                return await self._step(switch.plan.new, self.machine.stage, switch.plan.new)
        except Exception as e:  # noqa: BLE001 - nothing held or stopped yet: nothing to undo
            raise await self._rolled_back(switch.plan, e) from None

    async def _leave(self, switch: Switch) -> list[str]:
        """The old stack makes room: parked, or stopped (its containers, to start on a rollback)."""
        plan = switch.plan
        assert plan.old is not None
        if plan.park is Park.STOP:
            with switch.timed("stop_old_s"):
                return await self._step(plan.old, self.machine.stop, plan.old, drained=switch.facts["drained"])
        with switch.timed("park_old_s"):
            await self._park(plan.old, plan.park.level)
        return []

    async def _park(self, stack: str, level: int, *, quiesce: bool = True) -> None:
        """Park a stack in its turn; `quiesce`: once the gateway stopped routing to it and its
        requests finished (its names then wake it on demand)."""
        async def before() -> None:
            await blocking(self.refresh_routes)
            await self.gateway.drain(stack)

        async with self.turns.turn(stack):
            await self.sleeper.park(stack, level, before=before if quiesce else None)
        if quiesce:
            await blocking(self.refresh_routes)

    async def _bring_up(self, switch: Switch, staged: Staged | None = None) -> None:
        """The new stack woken, or through the whole pipeline; then the benchmark gate if it has one."""
        new = switch.plan.new
        desired = await blocking(self.desired.update, lambda d: d.with_stack(new))
        if switch.plan.wake or new in desired.parked:  # asleep, or parked stopped
            with switch.timed("wake_s"):
                woken = await self._step(new, self.sleeper.wake, new)
            await blocking(self.woke, new, woken)
            switch.facts["woken"] = asdict(woken)
        else:
            with switch.timed("deploy_s"):
                done = await self._step(new, self.machine.deploy, new, staged=staged)
            switch.timings |= done.timings if done else {}
        await blocking(self.refresh_routes)  # routes the new stack by name (the gate benchmarks through the gateway)
        if self.bench_mode(new) == "gate":
            with switch.timed("bench_s"):
                switch.facts["bench"] = await blocking(self.bench, new)

    async def _flip(self, switch: Switch) -> None:
        plan = switch.plan
        began = time.time()  # any route rebuild (the reconciler's too) may take the new alias from here on
        await blocking(self.desired.update, lambda d: replace(d, aliases={**d.aliases, plan.alias: plan.new}))
        await blocking(self.refresh_routes)
        switch.facts["flipped"] = [began, time.time()]  # the gateway took the new routes in this window
        self._note(plan, f"{plan.alias} now names {plan.new}")

    async def _remove(self, stack: str) -> None:
        await blocking(self.desired.update, lambda d: d.without_stack(stack))
        await self._step(stack, self.machine.down, stack)

    async def _retire(self, switch: Switch, stack: str) -> None:
        """Remove the old stack after the flip: the switch stands whatever happens here."""
        try:
            await self._remove(stack)
        except SparkctlError as e:  # it is no longer desired: the reconciler removes it later
            switch.facts["cleanup_error"] = str(e)
            self.reporter.note(stack, f"{stack} was not removed after the switch ({e}); the daemon will retry")

    async def _rolled_back(self, plan: SwitchPlan, cause: Exception) -> SwitchFailed:
        keeps = f"{plan.alias} still names {plan.old}, which keeps serving" if plan.old else \
            f"{plan.alias} was not changed"
        blamed = await blocking(self.blame, plan.new, cause)
        said = cause if isinstance(cause, SparkctlError) else f"{type(cause).__name__}: {cause}"  # a bug: its kind too
        return SwitchFailed(f"switch of {plan.alias} to {plan.new} rolled back: {keeps}. Cause: {said}"
                            + (f"\n{blamed}" if blamed else ""))

    async def _bench_after(self, stack: str) -> dict[str, Any]:
        try:
            return await blocking(self.bench, stack)
        except SparkctlError as e:  # the switch stands; the report says what the benchmark found
            self.reporter.note(stack, f"switch-over benchmark: {e}")
            return {"error": str(e)}

    def _note(self, plan: SwitchPlan, text: str) -> None:
        self.reporter.note(plan.alias, text)


async def recover(desired: DesiredFile, sleeper: Sleeper, machine: DockerMachine, store: Store) -> list[str]:
    """Settle switches a killed daemon left unfinished, from desired.yaml alone: an alias that
    already names the new stack completes (the old stack leaves the desired set, or is parked),
    one that does not rolls back (the new stack leaves it, unless it was desired before, and an
    old stack the switch parked wakes once the new one is gone). The reconciler then converges
    the containers. Returns what it did, for the log."""
    done = []
    for s in store.switches.list(unfinished=True):
        alias, old, new = s["alias"], s["from"], s["to"]
        park = Park(s.get("park") or Park.STOP)
        flipped = (await blocking(desired.read)).aliases.get(alias) == new
        try:
            if flipped and old and s["stop_old"] and park is Park.STOP:
                await blocking(desired.update, lambda d, old=old: d.without_stack(old))
            elif flipped and old and s["stop_old"] and old not in (await blocking(desired.read)).parked:
                await sleeper.park(old, park.level)
            elif not flipped:
                if s["new_was_desired"] and s.get("wake") and new not in (await blocking(desired.read)).parked:
                    await sleeper.park(new, s["wake"])  # it was woken for the switch: back to sleep first
                if not s["new_was_desired"]:
                    await blocking(desired.update, lambda d, new=new: d.without_stack(new))
                    if park is not Park.STOP:  # its memory must be free before the old stack wakes
                        await blocking(machine.down, new)
                if old in (await blocking(desired.read)).parked:
                    await blocking(sleeper.wake, old)
        except SparkctlError as e:
            done.append(f"switch {s['id']} of {alias}: {e}")
        outcome = f"completed: {alias} names {new}" if flipped else f"rolled back: {alias} names {old}"
        intent = {k: v for k, v in s.items() if k not in ("id", "at")}
        await blocking(store.switches.finish, s["id"], intent | {"ok": flipped, "error": None if flipped else
                                               f"interrupted: the daemon stopped mid-switch; {outcome}"})
        done.append(f"switch {s['id']} of {alias} {outcome}")
    return done


@dataclass(kw_only=True)
class Aliases:
    settings: Settings
    catalog: Callable[[], Catalog]
    desired: DesiredFile
    reconciler: Reconciler
    routes: Routes
    turns: Turns
    memory: Callable[[], MemoryView]
    memory_lock: asyncio.Lock  # as `Parking.memory_lock`
    store: Store
    kick: Callable[[], None]  # ask the reconcile loop for a pass
    serving_since: dict[str, float]  # when each stack last came up or woke (monotonic)
    switcher: Switcher
    deploys: Deploys
    parking: Parking
    machines: Machines  # each stack's machine: this Spark's (`switch_here`) or the fleet's

    async def switch(self, alias: str, stack: str, *, ticket: int | None = None) -> SwitchDone:
        """Move `alias` to `stack` (blue/green or hold/swap); rolled back on any failure."""
        async with self.turns.turn(f"alias:{alias}", ticket):  # one switch of an alias at a time
            spec = await blocking(self._target, alias, stack)
            machine = await blocking(self.machines.of, spec.name)
            return await machine.switch(alias, spec)

    async def switch_here(self, alias: str, spec: Stack) -> SwitchDone:
        """On this Spark's Docker machine (`machines.Spark`), in the alias's turn."""
        if (await blocking(self.desired.read)).aliases.get(alias) == spec.name:  # as `up`: make sure, no change
            return SwitchDone(alias, spec.name, "unchanged", up=await self.deploys.up(spec.name))
        async with self.memory_lock:
            plan = await blocking(self._plan, alias, spec)
            self.reconciler.forget(spec.name)
            try:
                return await self.switcher.run(plan)
            finally:
                self.serving_since[spec.name] = time.monotonic()
                self.kick()

    def _target(self, alias: str, stack: str) -> Stack:
        """The stack a switch of `alias` goes to, unless the alias is routed by prompt length."""
        spec = self.catalog().stack(stack)
        if rules := self.desired.read().routes.get(alias):
            raise SparkctlError(f"{alias} is routed by prompt length ({'; '.join(r.describe() for r in rules)}): "
                                f"change its rules with `sparkctl route set {alias} ...`, or `sparkctl route rm "
                                f"{alias}` and switch it then")
        return spec

    def _plan(self, alias: str, spec: Stack) -> SwitchPlan:
        """The switch's plan (`policy/switch.py`), from the memory as it is now."""
        desired, view = self.desired.read(), self.memory()
        old, memory = desired.aliases.get(alias), view.now(desired.parked)
        leaving = Leaving()
        if old in self.catalog().stacks and old in memory.held and old not in memory.parked:
            old_spec = self.catalog().stack(old)
            leaving = Leaving(old_spec.switch.park, view.footprint(old),
                              self.parking.cannot_sleep(old_spec, waking=spec.name))
        # a stack a routed alias names is still named: the switch leaves it running
        named = desired.aliases | {f"{a}[{i}]": r.stack for a, rules in desired.routes.items()
                                   for i, r in enumerate(rules)}
        return plan_switch(alias, spec.name, footprint=view.footprint(spec.name), aliases=named, memory=memory,
                           leaving=leaving)

    async def route(self, alias: str, rules: str, *, ticket: int | None = None) -> RouteDone:
        """Route `alias` by prompt length (`rules`: `STACK:TOKENS ... STACK`), or, with no rules,
        make it unrouted. Every stack it names must be up or parked: the gateway may send a
        request to any of them at once."""
        async with self.turns.turn(f"alias:{alias}", ticket):
            return await blocking(self._route, alias, rules)

    def _route(self, alias: str, rules: str) -> RouteDone:
        """The route change, checked, made and routed (blocking: Docker, the store, desired.yaml)."""
        parsed = routing.check(alias, [routing.parse(r) for r in rules.split()]) if rules.strip() else None
        catalog = self.catalog()
        memory, serving = 0.0, {}
        for rule in parsed or ():
            spec = catalog.stack(rule.stack)
            machine = self.machines.of(rule.stack)
            if not machine.serves(rule.stack):
                raise SparkctlError(f"routed alias {alias}: {rule.stack} is neither up nor parked, and the gateway "
                                    f"may send it a request at any time; `sparkctl up {rule.stack}` first")
            memory += spec.resources.gpu_memory_utilization if machine.local else 0.0
            serving[rule.stack] = self._serving(spec)
        fits = routing.fit(parsed or (), serving)
        self.desired.update(lambda d: d.routed(alias, parsed))
        self.routes.refresh()
        if parsed is None:
            return RouteDone(alias)
        return RouteDone(alias, tuple(RouteRule(r.stack, r.up_to) for r in parsed), round(memory, 3),
                         self.settings.memory_ceiling, tuple(fits))

    def _serving(self, spec: Stack) -> routing.Serving:
        """The context a stack serves and its KV cache, as its last deploy recorded them (else its spec)."""
        latest = self.store.deployments.latest(spec.name)
        headroom = latest and latest.fingerprint and self.store.deployments.headroom(spec.name, latest.fingerprint)
        configured = spec.vllm.max_model_len if spec.vllm else None
        if not headroom:
            return routing.Serving(configured)
        return routing.Serving(headroom.max_model_len or configured, headroom.kv_tokens)
