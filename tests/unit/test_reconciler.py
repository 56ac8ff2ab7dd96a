"""The reconciler's planning (pure, table-driven) and its passes against a recording fake of
the machine, with an injected clock and no sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from sparkctl.daemon import planner
from sparkctl.daemon.events import EventBus
from sparkctl.daemon.planner import (
    Deploy,
    GiveUp,
    History,
    Observed,
    Policy,
    Prefetch,
    Realias,
    Remove,
    Restart,
    Wait,
    backoff,
    plan,
)
from sparkctl.daemon.reconciler import Reconciler
from sparkctl.daemon.turns import Turns
from sparkctl.errors import SparkctlError
from sparkctl.state.desired import Desired

T = TypeVar("T")
POLICY = Policy(crash_loop=5, window=600, backoff_base=1, backoff_max=60)
NOW = 10_000.0


def run(c: str = "c1", stack: str = "a", state: str = "running") -> Observed:
    return Observed(stack, c, state)


CASES = [
    ("nothing desired, nothing running", (), [], {}, []),
    ("desired and absent -> deploy", ("a",), [], {}, [Deploy("a")]),
    ("desired and running -> nothing", ("a",), [run()], {}, []),
    ("not desired -> removed", (), [run()], {}, [Remove("c1", "no desired stack claims a")]),
    ("died once -> restart now", ("a",), [run(state="exited")], {"a": History(failures=(NOW - 1,))},
     [Restart("a", "c1")]),
    ("died twice -> backoff 1 s", ("a",), [run(state="exited")],
     {"a": History(failures=(NOW - 10, NOW - 0.5))}, [Wait("a", NOW + 0.5)]),
    ("backoff over -> restart", ("a",), [run(state="exited")], {"a": History(failures=(NOW - 10, NOW - 2))},
     [Restart("a", "c1")]),
    ("crash loop -> give up", ("a",), [run(state="exited")], {"a": History(failures=tuple(NOW - i for i in range(5)))},
     [GiveUp("a", "crash loop: 5 failures in 600 s")]),
    ("old failures don't count", ("a",), [run(state="exited")],
     {"a": History(failures=tuple(NOW - 1000 - i for i in range(5)))}, [Restart("a", "c1")]),
    ("given up -> left alone", ("a",), [run(state="exited")], {"a": History(failed="crash loop")}, []),
    ("busy -> left alone", ("a",), [], {"a": History(busy=1)}, []),
    ("two running -> duplicate removed", ("a",), [run("c1"), run("c2")], {},
     [Remove("c2", "duplicate container of a")]),
]


@pytest.mark.parametrize(("stacks", "observed", "history", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_plan(stacks, observed, history, expected) -> None:
    assert list(plan(stacks, {}, {}, observed, history, now=NOW, policy=POLICY).actions) == expected


def test_alias_falls_back_when_its_stack_is_given_up() -> None:
    history = {"a": History(failures=tuple(NOW - i for i in range(5)))}
    actions = plan(("a", "b"), {"primary": "a"}, {"primary": "b"}, [run(state="exited"), run("c2", "b")], history,
                   now=NOW, policy=POLICY).actions
    assert Realias("primary", "b", "a failed: crash loop: 5 failures in 600 s") in actions
    assert not plan(("a",), {"primary": "a"}, {}, [], {"a": History(failed="x")}, now=NOW, policy=POLICY).actions


STANDBY = "the fallback of alias primary: a failover to it then waits only for its engine"


@pytest.mark.parametrize(("fetched", "history", "expected"), [
    (False, {}, [Prefetch("b", STANDBY.replace("primary", "batch, primary"))]),
    (True, {}, []),  # here already
    (False, {"b": History(busy=1)}, []),  # being fetched (or deployed) now
    (False, {"b": History(failures=(NOW - 1,))}, []),  # a failed prefetch waits for an `up` or a restart
], ids=["absent", "fetched", "busy", "failed"])
def test_a_fallback_that_is_not_desired_is_prefetched_unless_here(fetched, history, expected) -> None:
    got = plan(("a",), {"primary": "a", "batch": "a"}, {"primary": "b", "batch": "b"}, [run()], history, now=NOW,
               policy=POLICY, fetched=lambda s: fetched and s == "b").actions
    assert list(got) == expected  # one prefetch for both aliases
    assert not plan(("a", "b"), {"primary": "a"}, {"primary": "b"}, [run(), run("c2", "b")], {}, now=NOW,
                    policy=POLICY).of(Prefetch)  # a desired fallback runs already


def test_backoff_is_exponential_and_capped() -> None:
    assert [backoff(n, POLICY) for n in (1, 2, 3, 4, 5, 10)] == [0, 1, 2, 4, 8, 60]


@dataclass
class FakeMachine:
    """Records every call; containers appear and vanish as a real engine's would."""

    containers: list[Observed] = field(default_factory=list)
    wanted: Desired = field(default_factory=Desired)
    calls: list[tuple[str, str]] = field(default_factory=list)
    deploy_fails: bool = False
    here: set[str] = field(default_factory=set)  # stacks whose image, weights and patches are here

    def observe(self) -> list[Observed]:
        return list(self.containers)

    def deploy_absent(self, stack: str) -> None:
        self.deploy(stack)

    def fetch(self, stack: str) -> None:
        self.calls.append(("fetch", stack))
        self.here.add(stack)

    def fetched(self, stack: str) -> bool:
        return stack in self.here

    def deploy(self, stack: str) -> None:
        self.calls.append(("deploy", stack))
        if self.deploy_fails:
            raise SparkctlError("engine container exited with code 1 while loading")
        self.containers.append(Observed(stack, f"id-{stack}-{len(self.calls)}", "running"))

    def start(self, container: str) -> None:
        self.calls.append(("start", container))
        self.containers = [Observed(o.stack, o.container, "running") if o.container == container else o
                           for o in self.containers]

    def remove(self, container: str) -> None:
        self.calls.append(("remove", container))
        self.containers = [o for o in self.containers if o.container != container]

    def read(self) -> Desired:  # the desired file's owner too
        return self.wanted

    def update(self, change) -> Desired:
        self.wanted = change(self.wanted)
        return self.wanted


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def reconciler(machine: FakeMachine, clock: Clock) -> Reconciler:
    return Reconciler(machine, desired=machine, turns=Turns(), bus=EventBus(), policy=POLICY, clock=clock)


def go(coroutine: Coroutine[Any, Any, T]) -> T:
    """One of the reconciler's coroutines, run to its end with the actions it started."""
    async def run() -> T:
        result = await coroutine
        while others := asyncio.all_tasks() - {asyncio.current_task()}:
            await asyncio.gather(*others)
        return result

    return asyncio.run(run())


def test_converges_adopts_and_removes_strays() -> None:
    machine = FakeMachine([run("mine", "a"), run("stray", "old")], Desired(("a", "b")))
    r = reconciler(machine, Clock())
    go(r.reconcile())
    assert machine.calls == [("remove", "stray"), ("deploy", "b")]  # "mine" adopted, untouched
    machine.calls.clear()
    go(r.reconcile())
    assert machine.calls == []  # converged: a second pass does nothing


def test_a_crash_is_restarted_then_a_crash_loop_gives_up_and_moves_the_alias() -> None:
    clock = Clock()
    machine = FakeMachine([run("c1", "a"), run("c2", "b")],
                          Desired(("a", "b"), aliases={"primary": "a"}, fallbacks={"primary": "b"}))
    r = reconciler(machine, clock)
    for crash in range(5):
        machine.containers = [Observed("a", "c1", "exited") if o.stack == "a" else o for o in machine.containers]
        go(r.died("a", oom=crash == 0, exit_code=137))
        clock.now += 100  # past every backoff, inside the 600 s window
        go(r.reconcile())
    assert machine.calls == [("start", "c1")] * 4  # the fifth death is the crash loop
    assert r.history["a"].failed == "crash loop: 5 failures in 600 s"
    assert machine.wanted.aliases["primary"] == "b"
    kinds = [e["kind"] for e in go(r.bus.wait_after(0, timeout=0))]
    assert kinds.count("died") == 5 and "failed" in kinds and "realiased" in kinds


def test_a_standby_fallback_is_prefetched_once_and_a_crash_loop_deploys_it() -> None:
    clock = Clock()
    machine = FakeMachine([run("c1", "a")], Desired(("a",), aliases={"primary": "a"}, fallbacks={"primary": "b"}))
    r = reconciler(machine, clock)
    go(r.reconcile())
    go(r.reconcile())
    assert machine.calls == [("fetch", "b")]  # once: then it is here
    for _ in range(5):
        machine.containers = [Observed("a", "c1", "exited")]
        go(r.died("a", oom=False, exit_code=1))
        clock.now += 100
        go(r.reconcile())
    assert machine.wanted.aliases == {"primary": "b"} and "b" in machine.wanted.stacks  # desired, so deployed:
    go(r.reconcile())
    assert machine.calls[-1] == ("deploy", "b")


def test_a_death_reported_while_a_pass_restarts_the_engine_still_counts() -> None:
    """A pass can see the engine dead and start it before Docker's `die` event is handled: the
    event then arrives while the stack is busy with that restart, and is still a crash."""
    machine = FakeMachine([Observed("a", "c1", "exited")], Desired(("a",)))
    r = reconciler(machine, Clock())
    counted = []
    start = machine.start
    machine.start = lambda c: (counted.append(go(r.died("a", oom=False, exit_code=137))), start(c))  # on its worker
    go(r.reconcile())
    assert counted == [True] and len(r.history["a"].failures) == 1
    assert [e["kind"] for e in go(r.bus.wait_after(0, timeout=0))].count("died") == 1


def test_a_parked_stack_is_not_started_again() -> None:
    """Parked stopped (or asleep when its engine died): starting it would hold memory the
    switch gave to another stack; waking it is the way back."""
    observed = [Observed("a", "c1", "exited"), Observed("b", "c2", "running")]
    machine = FakeMachine(observed, Desired(("a", "b", "c"), parked={"a": 0, "b": 1, "c": 2}))
    assert go(reconciler(machine, Clock()).reconcile()).actions == ()


def test_a_pass_deploy_ending_inside_a_switch_leaves_the_stack_held() -> None:
    """A switch can take hold of a stack while a pass is still deploying it: when that deploy
    ends, the stack stays held, so the switch's own stop is no crash and no pass restarts it."""
    machine = FakeMachine(wanted=Desired(("a",)))
    r = reconciler(machine, Clock())
    held = r.holding("a")
    deploy = machine.deploy
    machine.deploy = lambda stack: (held.__enter__(), deploy(stack))  # the switch arrives mid-deploy
    go(r.reconcile())
    assert r.history["a"].busy == 1
    machine.containers = [Observed("a", o.container, "exited") for o in machine.containers]  # the switch stops it
    r.forget("a")  # an `up` asked meanwhile: failures go, the hold stays
    assert not go(r.died("a", oom=False, exit_code=0))
    go(r.reconcile())
    assert machine.calls == [("deploy", "a")]
    held.__exit__(None, None, None)
    assert r.history["a"].busy == 0


def test_failed_deploys_count_towards_the_crash_loop_and_forget_resets() -> None:
    clock = Clock()
    machine = FakeMachine(wanted=Desired(("a",)), deploy_fails=True)
    r = reconciler(machine, clock)
    for _ in range(5):
        go(r.reconcile())
        clock.now += 100
    go(r.reconcile())
    assert machine.calls == [("deploy", "a")] * 5 and r.history["a"].failed
    r.forget("a")
    machine.deploy_fails = False
    go(r.reconcile())
    assert machine.calls[-1] == ("deploy", "a") and not r.history["a"].failed


def test_deaths_of_stacks_not_desired_are_not_failures() -> None:
    machine = FakeMachine(wanted=Desired(("a",)))
    r = reconciler(machine, Clock())
    go(r.died("gone", oom=False, exit_code=0))
    assert "gone" not in r.history


def test_backoff_wait_sets_the_next_wake() -> None:
    clock = Clock()
    machine = FakeMachine([Observed("a", "c1", "exited")], Desired(("a",)))
    r = reconciler(machine, clock)
    go(r.died("a", oom=False, exit_code=1))
    go(r.died("a", oom=False, exit_code=1))
    the_plan = go(r.reconcile())
    assert the_plan.of(planner.Wait) and r.wake_at == NOW + 1 and machine.calls == []
    clock.now = r.wake_at
    go(r.reconcile())
    assert machine.calls == [("start", "c1")]


def test_an_oom_kill_is_reported_as_such(workspace) -> None:
    from sparkctl.container import Event
    from sparkctl.daemon.app import Daemon
    from sparkctl.settings import Settings

    seen = []

    async def died(stack: str, *, oom: bool, exit_code: int | None) -> bool:
        seen.append((stack, oom, exit_code))
        return True

    async def scenario() -> Daemon:  # inside an event loop, as `daemon.app.run` makes the daemon
        daemon = Daemon(Settings())
        daemon.reconciler.died = died
        actor = {"Attributes": {"sparkctl.stack": "qwen36-dflash", "sparkctl.instance": daemon.settings.instance,
                                "exitCode": "137"}}
        for action in ("oom", "die", "die"):  # as Docker's stream decodes them
            await daemon.loops.on_event(Event.from_stream({"Action": action, "id": "c1", "Actor": actor}))
        assert seen == [("qwen36-dflash", True, 137), ("qwen36-dflash", False, 137)]
        for other in ({"sparkctl.instance": "default"}, {}):  # another instance's, or one made before instances
            await daemon.loops.on_event(Event.from_stream({"Action": "die", "id": "c2", "Actor": {"Attributes": {
                "sparkctl.stack": "qwen36-dflash", "exitCode": "1", **other}}}))
        return daemon

    daemon = asyncio.run(scenario())
    assert len(seen) == 2
    assert [e["detail"] for e in daemon.store.events.list("qwen36-dflash")] == ["exit code 137", "OOM-killed"]


def test_a_finished_action_asks_for_another_pass() -> None:
    """A restart that fails (its container died again meanwhile) must be retried at once, not at the
    next resync: after a kill -9 mid-switch, that wait was the 30 s an agent could not be served."""
    machine = FakeMachine([Observed("a", "c1", "exited")], Desired(("a",)), deploy_fails=True)
    machine.start = lambda container: (_ for _ in ()).throw(SparkctlError("exited while loading"))
    passes: list[int] = []
    r = Reconciler(machine, desired=machine, turns=Turns(), bus=EventBus(), policy=POLICY, clock=Clock(),
                   settled=lambda: passes.append(r.passes))
    go(r.reconcile())
    assert passes == [1] and len(r.history["a"].failures) == 1
