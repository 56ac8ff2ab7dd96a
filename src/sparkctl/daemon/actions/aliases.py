"""Switching an alias to another stack (blue/green or hold/swap, across the fleet when the stack
is placed there; rolled back on any failure) and routing an alias by prompt length."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkctl.daemon.actions.deploys import Deploys
from sparkctl.daemon.actions.parking import Parking
from sparkctl.daemon.reconciler import Reconciler
from sparkctl.daemon.routes import Routes
from sparkctl.daemon.seam import blocking
from sparkctl.daemon.switch import Switcher
from sparkctl.daemon.turns import Turns
from sparkctl.deploy.memory import MemoryView
from sparkctl.errors import SparkctlError
from sparkctl.messages import RouteDone, RouteRule, SwitchDone
from sparkctl.policy import routing
from sparkctl.policy.switch import Leaving, SwitchPlan, plan_switch
from sparkctl.settings import Settings
from sparkctl.spec.load import Catalog
from sparkctl.spec.models import Stack
from sparkctl.state.desired import DesiredFile
from sparkctl.state.store import Store

if TYPE_CHECKING:
    from sparkctl.daemon.actions.machines import Machines


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

