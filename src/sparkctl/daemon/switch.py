"""`sparkctl switch [ALIAS] STACK`: move an alias to another stack without failing the agent.

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

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import structlog

from sparkctl.daemon.machine import DockerMachine
from sparkctl.daemon.reconciler import Reconciler
from sparkctl.daemon.seam import blocking
from sparkctl.daemon.sleeper import Sleeper
from sparkctl.daemon.turns import Turns
from sparkctl.deploy.launch import Staged
from sparkctl.deploy.progress import Reporter
from sparkctl.errors import SparkctlError
from sparkctl.gateway.proxy import Gateway
from sparkctl.messages import SwitchDone, WakeDone
from sparkctl.policy.parking import Park
from sparkctl.policy.switch import Mode, SwitchPlan
from sparkctl.state.desired import DesiredFile
from sparkctl.state.store import Store

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
