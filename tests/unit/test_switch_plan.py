"""The switch's pure plan (blue/green vs hold/swap vs refused) and its rollbacks, against a
recording fake of the machine, the sleeper, the desired file and the gateway."""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import pytest

from sparkctl.daemon.actions.switch import Switcher, SwitchFailed, recover
from sparkctl.daemon.turns import Turns
from sparkctl.deploy.progress import RecordingReporter
from sparkctl.errors import SparkctlError
from sparkctl.messages import SwitchDone
from sparkctl.policy.parking import Footprint, Park
from sparkctl.policy.switch import Leaving, Memory, Mode, plan_switch
from sparkctl.state.desired import Desired
from sparkctl.state.store import Store

CASES = [  # (aliases, running shares, new share) -> mode, stop old
    ({"primary": "a"}, {"a": 0.4}, 0.4, Mode.BLUE_GREEN, True),
    ({"primary": "a"}, {"a": 0.8}, 0.8, Mode.HOLD_SWAP, True),
    ({"primary": "a", "batch": "a"}, {"a": 0.4}, 0.4, Mode.BLUE_GREEN, False),  # a still serves batch
    ({}, {"c": 0.5}, 0.3, Mode.BLUE_GREEN, True),  # a new alias: nothing to stop
    ({"primary": "a"}, {}, 0.8, Mode.BLUE_GREEN, True),  # a is not running: nothing to hold for
    ({"primary": "a"}, {"a": 0.5, "b": 0.3}, 0.3, Mode.BLUE_GREEN, True),  # b (the new one) already runs
]


@pytest.mark.parametrize(("aliases", "running", "share", "mode", "stop_old"), CASES)
def test_plan_modes(aliases, running, share, mode, stop_old) -> None:
    plan = plan_switch("primary", "b", footprint=Footprint(share, 0.1), aliases=aliases,
                       memory=Memory(running, 0.9))
    assert (plan.mode, plan.stop_old, plan.old, plan.park) == (mode, stop_old, aliases.get("primary"), Park.STOP)


@pytest.mark.parametrize(("aliases", "running", "words"), [
    ({"primary": "b"}, {"b": 0.4}, "already names b"),
    ({"primary": "a"}, {"a": 0.5, "c": 0.5}, "does not fit even once a stops"),
    ({"primary": "a", "batch": "a"}, {"a": 0.8}, "also serves alias batch"),
])
def test_refused_plans_say_why(aliases, running, words) -> None:
    with pytest.raises(SparkctlError, match=words):
        plan_switch("primary", "b", footprint=Footprint(0.8, 0.1), aliases=aliases, memory=Memory(running, 0.9))


PARKING = [  # (what else holds memory, a's weights, its setting) -> how a leaves for b (0.4 awake)
    ({}, 0.05, Park.AUTO, Mode.BLUE_GREEN, Park.SLEEP1),  # parking peaks at 0.4 + 0.45
    ({}, 0.2, Park.AUTO, Mode.BLUE_GREEN, Park.SLEEP2),  # level 1 would peak at 1.0
    ({}, 0.2, Park.SLEEP1, Mode.BLUE_GREEN, Park.STOP),  # only level 1 was allowed, and it does not fit
    ({"c": 0.2}, 0.1, Park.AUTO, Mode.HOLD_SWAP, Park.SLEEP1),  # b fits only once a made room
    ({"c": 0.2}, 0.35, Park.AUTO, Mode.HOLD_SWAP, Park.SLEEP2),
    ({"c": 0.48}, 0.1, Park.AUTO, Mode.HOLD_SWAP, Park.STOP),  # not even the residue fits beside b
    ({"c": 0.2}, 0.1, Park.STOP, Mode.HOLD_SWAP, Park.STOP),
]


@pytest.mark.parametrize(("others", "weights", "setting", "mode", "park"), PARKING)
def test_the_old_stack_parks_as_deep_as_memory_allows(others, weights, setting, mode, park) -> None:
    plan = plan_switch("primary", "b", footprint=Footprint(0.4, 0.2), aliases={"primary": "a"},
                       memory=Memory({"a": 0.4, **others}, 0.9),
                       leaving=Leaving(setting, Footprint(0.4, weights, residue=0.03)))
    assert (plan.mode, plan.park) == (mode, park), plan.why
    assert str(park) in plan.why


def test_a_parked_new_stack_wakes_and_its_wake_peak_must_fit() -> None:
    memory = Memory({"a": 0.5, "b": 0.3}, 0.9, parked={"b": 1})  # b holds its weights
    plan = plan_switch("primary", "b", footprint=Footprint(0.4, 0.3), aliases={"primary": "a"}, memory=memory,
                       leaving=Leaving(Park.AUTO, Footprint(0.5, 0.3)))
    assert (plan.mode, plan.wake) == (Mode.HOLD_SWAP, 1)  # 0.5 + 0.7 peak > 0.9
    assert plan.park is Park.SLEEP2  # a at level 1 would leave 0.3 + 0.7 > 0.9
    with pytest.raises(SparkctlError, match="wakes from level 1"):
        plan_switch("primary", "b", footprint=Footprint(0.4, 0.3), aliases={"primary": "a"},
                    memory=Memory({"a": 0.5, "b": 0.3, "c": 0.3}, 0.9, parked={"b": 1}))


def test_a_stack_that_cannot_sleep_stops_and_says_why() -> None:
    plan = plan_switch("primary", "b", footprint=Footprint(0.4, 0.1), aliases={"primary": "a"},
                       memory=Memory({"a": 0.4}, 0.9),
                       leaving=Leaving(Park.AUTO, Footprint(0.4, 0.1), unable="vLLM's CPU backend has no sleep mode"))
    assert plan.park is Park.STOP and "CPU backend" in plan.why


@dataclass
class World:
    """Records what the switch did, in order; `fail` names the step that raises."""

    fail: str | None = None
    error: type[Exception] = SparkctlError  # what the failing step raises
    state: Desired = field(default_factory=lambda: Desired(("a",), {"primary": "a"}))
    calls: list[str] = field(default_factory=list)
    drains: bool = True  # the old stack's requests all finished within the drain's timeout
    stopped_drained: bool | None = None  # what the switch told `stop`

    def read(self) -> Desired:
        return self.state

    def update(self, change) -> Desired:
        self.state = change(self.state)
        return self.state

    def stage(self, stack: str) -> str:
        self._do(f"stage {stack}")
        return SimpleNamespace(stack=stack)  # a `Staged`, as far as the switch reads it

    def discard(self, staged: SimpleNamespace, why: str) -> None:
        self._do(f"discard staged {staged.stack}")

    def deploy(self, stack: str, *, staged: SimpleNamespace | None = None) -> None:
        assert staged is None or staged.stack == stack
        self._do(f"deploy {stack}")

    def down(self, stack: str) -> int:
        self._do(f"down {stack}")
        return 1

    async def park(self, stack: str, level: int, *, before=None) -> None:
        if before is not None:
            await before()
        self._do(f"park {stack} {level}")

    def stop(self, stack: str, *, drained: bool = False) -> list[str]:
        self._do(f"stop {stack}")
        self.stopped_drained = drained
        return [f"{stack}-container"]

    def start(self, container: str) -> None:
        self._do(f"start {container}")

    def hold(self, alias: str, old: str | None, new: str) -> None:
        self._do(f"hold {alias}")

    def release(self, alias: str) -> dict[str, float]:
        self._do(f"release {alias} -> {self.state.aliases[alias]}")
        return {"held_requests": 3, "hold_s": 1.0}

    async def drain(self, stack: str) -> bool:
        self._do(f"drain {stack}")
        return self.drains

    def bench(self, stack: str) -> dict:
        self._do(f"bench {stack}")
        return {"summary": "ok"}

    @contextmanager
    def holding(self, stack: str):
        self.calls.append(f"busy {stack}")
        try:
            yield
        finally:
            self.calls.append(f"free {stack}")

    def _do(self, call: str) -> None:
        self.calls.append(call)
        if self.fail and call.startswith(self.fail):
            raise self.error(f"{call} failed")


def run(world: World, mode: Mode, *, bench: str = "off", tmp_path) -> SwitchDone:
    plan = replace(plan_switch("primary", "b", footprint=Footprint(0.4, 0.1), aliases={"primary": "a"},
                               memory=Memory({"a": 0.4}, 0.9)), mode=mode)
    switcher = Switcher(machine=world, sleeper=world, desired=world, reconciler=world, turns=Turns(), gateway=world,
                        refresh_routes=lambda: None, store=Store(tmp_path / "s.db"), reporter=RecordingReporter(),
                        bench=world.bench, bench_mode=lambda _: bench)
    return asyncio.run(switcher.run(plan))


def recorded(tmp_path) -> dict:
    """The switch as the store has it (what a restarted daemon would settle)."""
    [record] = Store(tmp_path / "s.db").switches.list()
    return record


def test_blue_green_flips_before_draining_the_old_stack(tmp_path) -> None:
    world = World()
    result = run(world, Mode.BLUE_GREEN, bench="gate", tmp_path=tmp_path)
    assert world.calls == ["busy a", "busy b", "deploy b", "bench b", "drain a", "down a", "free b", "free a"]
    assert world.state == Desired(("b",), {"primary": "b"}) and recorded(tmp_path)["drained"] is True
    assert (result.alias, result.previous, result.stack, result.mode) == ("primary", "a", "b", "blue/green")


def test_hold_swap_releases_only_once_the_alias_names_the_new_stack(tmp_path) -> None:
    world = World()
    result = run(world, Mode.HOLD_SWAP, bench="after", tmp_path=tmp_path)
    assert world.calls == ["busy a", "busy b", "stage b", "hold primary", "drain a", "stop a", "deploy b",
                           "release primary -> b", "down a", "free b", "free a", "bench b"]
    assert result.held_requests == 3 and result.bench == {"summary": "ok"}
    assert "stage_s" in result.timings


def test_hold_swap_stages_the_new_stack_before_the_hold_and_starts_it_only_after_the_stop(tmp_path) -> None:
    """Preparing and creating the new stack holds no engine memory, so it runs while the old one
    still serves; its start (`deploy` of what was staged) waits for the old one's stop."""
    world = World()
    run(world, Mode.HOLD_SWAP, tmp_path=tmp_path)
    calls = world.calls
    assert calls.index("stage b") < calls.index("hold primary") < calls.index("stop a") < calls.index("deploy b")


@pytest.mark.parametrize("drains", [True, False])
def test_the_old_stack_is_killed_at_once_only_once_its_requests_drained(tmp_path, drains) -> None:
    """A drained engine has nothing to finish: its graceful shutdown would only lengthen the hold.
    One whose drain timed out keeps its grace for the requests still in flight."""
    world = World(drains=drains)
    run(world, Mode.HOLD_SWAP, tmp_path=tmp_path)
    assert recorded(tmp_path)["drained"] is drains and world.stopped_drained is drains


def test_a_stack_the_desired_set_already_claims_is_not_staged(tmp_path) -> None:
    """A staged container left by a killed daemon must be one the reconciler removes: a desired
    stack's created container would be started by it, without admission."""
    world = World(state=Desired(("a", "b"), {"primary": "a"}))
    run(world, Mode.HOLD_SWAP, tmp_path=tmp_path)
    assert "stage b" not in world.calls and world.calls.index("stop a") < world.calls.index("deploy b")


@pytest.mark.parametrize(("mode", "fail", "after_failure"), [
    (Mode.BLUE_GREEN, "deploy b", ["down b"]),
    (Mode.BLUE_GREEN, "bench b", ["down b"]),
    (Mode.HOLD_SWAP, "stage b", []),  # before the hold: nothing held, nothing stopped
    (Mode.HOLD_SWAP, "stop a", ["discard staged b", "release primary -> a"]),
    (Mode.HOLD_SWAP, "deploy b", ["down b", "start a-container", "release primary -> a"]),
    (Mode.HOLD_SWAP, "bench b", ["down b", "start a-container", "release primary -> a"]),
])
@pytest.mark.parametrize("error", [SparkctlError, RuntimeError])  # a bug inside the hold rolls back too
def test_a_failure_rolls_back_to_the_old_stack(tmp_path, mode, fail, after_failure, error) -> None:
    world = World(fail=fail, error=error)
    with pytest.raises(SwitchFailed, match="rolled back: primary still names a"):
        run(world, mode, bench="gate", tmp_path=tmp_path)
    assert world.calls[world.calls.index(fail) + 1:-2] == after_failure, world.calls
    assert world.state == Desired(("a",), {"primary": "a"})
    record = recorded(tmp_path)
    assert record["ok"] is False and f"{fail} failed" in record["error"]


@pytest.mark.parametrize("mode", [Mode.BLUE_GREEN, Mode.HOLD_SWAP])
def test_a_failure_after_the_flip_does_not_undo_the_switch(tmp_path, mode) -> None:
    world = World(fail="down a")
    run(world, mode, tmp_path=tmp_path)
    record = recorded(tmp_path)
    assert record["ok"] and "down a failed" in record["cleanup_error"]
    assert world.state.aliases == {"primary": "b"} and "a" not in world.state.stacks


@pytest.mark.parametrize(("desired", "settled"), [
    (Desired(("a", "b"), {"primary": "b"}), Desired(("b",), {"primary": "b"})),  # flipped: completes
    (Desired(("a", "b"), {"primary": "a"}), Desired(("a",), {"primary": "a"})),  # not flipped: rolls back
])
def test_a_switch_left_unfinished_by_a_kill_is_completed_or_undone(tmp_path, desired, settled) -> None:
    store = Store(tmp_path / "s.db")
    store.switches.begin({"alias": "primary", "from": "a", "to": "b", "mode": "hold/swap", "stop_old": True,
                        "new_was_desired": False})
    world = World(state=desired)
    [done] = asyncio.run(recover(world, world, world, store))
    assert world.state == settled and done.startswith("switch 1 of primary")
    assert store.switches.list(unfinished=True) == []
    assert store.switches.list()[0]["ok"] is (desired.aliases["primary"] == "b")
    assert asyncio.run(recover(world, world, world, store)) == []


def test_a_switch_that_fits_in_no_mode_is_refused_even_when_the_old_stack_sleeps() -> None:
    with pytest.raises(SparkctlError, match="does not fit: b wakes from level 1"):
        plan_switch("primary", "b", footprint=Footprint(0.45, 0.3), aliases={"primary": "a"},
                    memory=Memory({"a": 0.3, "b": 0.3, "c": 0.5}, 0.9, parked={"a": 1, "b": 1}))
    with pytest.raises(SparkctlError, match="does not fit: b starts"):
        plan_switch("new-alias", "b", footprint=Footprint(0.85, 0.1), aliases={}, memory=Memory({"c": 0.5}, 0.9))


def test_other_parked_stacks_are_stopped_to_make_room_largest_first_and_no_more() -> None:
    memory = Memory({"a": 0.8, "p": 0.09, "q": 0.04, "r": 0.01}, 0.9, parked={"p": 1, "q": 2, "r": 2})
    plan = plan_switch("primary", "b", footprint=Footprint(0.85, 0.1), aliases={"primary": "a"}, memory=memory)
    assert (plan.mode, plan.evict) == (Mode.HOLD_SWAP, ("p",))
    assert "parked p stopped first to make room" in plan.why
    awake = Memory({"a": 0.8, "c": 0.09}, 0.9)  # an awake stack is never stopped for room
    with pytest.raises(SparkctlError, match="does not fit even once a stops"):
        plan_switch("primary", "b", footprint=Footprint(0.85, 0.1), aliases={"primary": "a"}, memory=awake)


def test_the_switch_stops_the_evicted_parked_stacks_before_the_new_one_comes_up(tmp_path) -> None:
    world = World()
    plan = replace(plan_switch("primary", "b", footprint=Footprint(0.4, 0.1), aliases={"primary": "a"},
                               memory=Memory({"a": 0.4}, 0.9)), evict=("p",))
    asyncio.run(Switcher(machine=world, sleeper=world, desired=world, reconciler=world, turns=Turns(), gateway=world,
                         refresh_routes=lambda: None, store=Store(tmp_path / "s.db"), reporter=RecordingReporter(),
                         bench=world.bench, bench_mode=lambda _: "off").run(plan))
    assert world.calls.index("park p 0") < world.calls.index("deploy b")
