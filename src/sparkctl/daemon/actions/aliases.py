"""Switching an alias to another stack (blue/green or hold/swap, across the fleet when the stack
is placed there; rolled back on any failure) and routing an alias by prompt length."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sparkctl.daemon.actions.context import Context
from sparkctl.daemon.actions.deploys import Deploys
from sparkctl.daemon.actions.parking import Parking
from sparkctl.daemon.events import BusReporter
from sparkctl.daemon.switch import Switcher
from sparkctl.daemon.verdicts import Verdicts
from sparkctl.errors import SparkctlError
from sparkctl.messages import RouteDone, RouteRule, SwitchDone
from sparkctl.policy import routing
from sparkctl.policy.switch import Leaving, plan_switch
from sparkctl.spec.models import Stack


@dataclass
class Aliases:
    ctx: Context
    deploys: Deploys
    parking: Parking

    def switch(self, alias: str, stack: str, *, ticket: int | None = None) -> SwitchDone:
        """Move `alias` to `stack` (blue/green or hold/swap); rolled back on any failure."""
        with self.ctx.turns.turn(f"alias:{alias}", ticket), self.ctx.memory_lock:  # one switch of an alias at a time
            spec = self.ctx.machine.catalog().stack(stack)
            if rules := self.ctx.machine.desired().routes.get(alias):
                raise SparkctlError(f"{alias} is routed by prompt length ({'; '.join(r.describe() for r in rules)}): "
                                    f"change its rules with `sparkctl route set {alias} ...`, or `sparkctl route rm "
                                    f"{alias}` and switch it then")
            return self.ctx.machines.of(spec.name).switch(alias, spec)

    def switch_here(self, alias: str, spec: Stack) -> SwitchDone:
        """On this Spark's Docker machine (`machines.Spark`), in the alias's turn and the memory lock."""
        if self.ctx.machine.desired().aliases.get(alias) == spec.name:  # as `up` does: make sure, change nothing
            return SwitchDone(alias, spec.name, "unchanged", up=self.deploys.up(spec.name))
        desired, view = self.ctx.machine.desired(), self.ctx.memory()
        old, memory = desired.aliases.get(alias), view.now(desired.parked)
        leaving = Leaving()
        if old in self.ctx.machine.catalog().stacks and old in memory.held and old not in memory.parked:
            old_spec = self.ctx.machine.catalog().stack(old)
            leaving = Leaving(old_spec.switch.park, view.footprint(old),
                              self.parking.cannot_sleep(old_spec, waking=spec.name))
        # a stack a routed alias names is still named: the switch leaves it running
        named = desired.aliases | {f"{a}[{i}]": r.stack for a, rules in desired.routes.items()
                                   for i, r in enumerate(rules)}
        plan = plan_switch(alias, spec.name, footprint=view.footprint(spec.name), aliases=named,
                           memory=memory, leaving=leaving)
        self.ctx.reconciler.forget(spec.name)
        ctx, catalog = self.ctx, self.ctx.machine.catalog
        verdicts = Verdicts(ctx.settings, ctx.store, ctx.bus, lambda name: catalog().stack(name),
                            ctx.machine.docker)
        switcher = Switcher(machine=ctx.machine, reconciler=ctx.reconciler, gateway=ctx.gateway,
                            refresh_routes=ctx.routes.refresh, store=ctx.store, reporter=BusReporter(ctx.bus),
                            bench=verdicts.bench, blame=verdicts.blame, woke=self.parking.record_wake,
                            bench_mode=lambda s: catalog().stack(s).switch.bench)
        try:
            return switcher.run(plan)
        finally:
            self.ctx.serving_since[spec.name] = time.monotonic()
            self.ctx.kick()

    def route(self, alias: str, rules: str, *, ticket: int | None = None) -> RouteDone:
        """Route `alias` by prompt length (`rules`: `STACK:TOKENS ... STACK`), or, with no rules,
        make it unrouted. Every stack it names must be up or parked: the gateway may send a
        request to any of them at once."""
        with self.ctx.turns.turn(f"alias:{alias}", ticket):
            parsed = routing.check(alias, [routing.parse(r) for r in rules.split()]) if rules.strip() else None
            catalog = self.ctx.machine.catalog()
            memory, serving = 0.0, {}
            for rule in parsed or ():
                spec = catalog.stack(rule.stack)
                machine = self.ctx.machines.of(rule.stack)
                if not machine.serves(rule.stack):
                    raise SparkctlError(f"routed alias {alias}: {rule.stack} is neither up nor parked, and the gateway "
                                        f"may send it a request at any time; `sparkctl up {rule.stack}` first")
                memory += spec.resources.gpu_memory_utilization if machine.local else 0.0
                serving[rule.stack] = self._serving(spec)
            fits = routing.fit(parsed or (), serving)
            self.ctx.machine.update_desired(lambda d: d.routed(alias, parsed))
            self.ctx.routes.refresh()
        if parsed is None:
            return RouteDone(alias)
        return RouteDone(alias, tuple(RouteRule(r.stack, r.up_to) for r in parsed), round(memory, 3),
                         self.ctx.settings.memory_ceiling, tuple(fits))

    def _serving(self, spec: Stack) -> routing.Serving:
        """The context a stack serves and its KV cache, as its last deploy recorded them (else its spec)."""
        latest = self.ctx.store.deployments.latest(spec.name)
        headroom = latest and latest.fingerprint and self.ctx.store.deployments.headroom(spec.name, latest.fingerprint)
        configured = spec.vllm.max_model_len if spec.vllm else None
        if not headroom:
            return routing.Serving(configured)
        return routing.Serving(headroom.max_model_len or configured, headroom.kv_tokens)

