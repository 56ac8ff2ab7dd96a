"""Parking with vLLM's sleep mode through a real daemon, real dockerd and sim engines that sleep
and wake with vLLM's endpoints: switches under load that wake the parked stack instead of a cold
start, `auto` choosing level 1, level 2 and stop by memory the sim really allocates, the wake
watchdog against vLLM #50011's wake, and a daemon killed while stacks park or wake."""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
import urllib.request
from pathlib import Path

import openai
import pytest
from ruamel.yaml import YAML

from sparkctl.deploy.memory import GIB, available, meminfo
from sparkctl.sim.tinymodel import write_model
from tests.conftest import port
from tests.integration.agents import A, B, Load, amend, kill_during_switches, routed, switch
from tests.integration.conftest import containers, wait_for

PORTS = {A: 8107, B: 8110}
MB = 1 << 20
SPARK = {"SPARKCTL_MEMORY_TOTAL_GIB": "119", "SPARKCTL_PARK_RESIDUE_GIB": "2"}  # fractions as on a GB10


def sleeping(stack: str) -> bool | None:
    """What the stack's engine says (None: it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port(PORTS[stack])}/is_sleeping", timeout=5) as r:
            return json.loads(r.read())["is_sleeping"]
    except OSError:
        return None


def last(daemon, path: str, **request: str) -> dict:
    """The outcome of a streamed action."""
    *_, outcome = daemon.client.stream(path, request)
    return outcome


def history(daemon) -> list[dict]:
    return sorted(daemon.client.get("/v1/history")["switches"], key=lambda r: r["id"])


def test_twenty_switches_between_parked_stacks_fail_no_request_and_hold_only_for_the_wake(
        switching, engine, monkeypatch) -> None:
    for key, value in SPARK.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SPARKCTL_ENGINE_ENV", "SPARKCTL_SIM_TIME_SCALE=0.01,SPARKCTL_SIM_LOAD_SCALE=0.02")
    daemon = switching(small=False, park="auto")  # a cold start takes seconds here, a wake a fraction
    with Load(daemon.gateway + "/v1") as load:
        load.served_by(A)
        for i in range(20):
            target = B if i % 2 == 0 else A
            seen = len(load.answers)
            outcome = switch(daemon, target)
            assert outcome["ok"], outcome.get("error")
            load.served_by(target, since=seen)  # traffic on each stack between switches
    assert load.failures() == [], load.failures()[:3]
    assert {a.stack for a in load.answers} == {A, B}
    first, *rest = history(daemon)
    assert first["mode"] == "hold/swap" and first["park"] == "sleep1" and "deploy_s" in first["timings"]
    assert all(r["ok"] and r["park"] == "sleep1" and r["woken"]["level"] == 1 for r in rest)
    assert all(r["woken"]["killed"] is None and "wake_s" in r["timings"] for r in rest)
    cold, parked = first["hold_s"], statistics.median(r["hold_s"] for r in rest)
    print(f"held requests waited {cold:.2f} s for a cold start, {parked:.2f} s (median) for a wake")
    assert parked < cold / 2
    # Both engines live on: the alias's awake, the other asleep, as desired.yaml records it.
    assert sorted(c["Labels"]["sparkctl.stack"] for c in containers(engine)) == sorted([A, B])
    assert daemon.client.get("/v1/desired")["parked"] == {B: 1}
    assert (sleeping(A), sleeping(B)) == (False, True)


def settled(daemon) -> bool:
    """The alias names an awake, routed stack; the other is asleep as desired.yaml records it,
    or not running at all."""
    desired = daemon.client.get("/v1/desired")
    primary = desired["aliases"].get("primary")
    other = B if primary == A else A
    serving = primary not in desired["parked"] and routed(daemon.gateway) == primary and sleeping(primary) is False
    return serving and (sleeping(other) is None or (sleeping(other) and desired["parked"].get(other, 0) > 0))


def test_a_daemon_killed_while_stacks_park_or_wake_comes_back_as_recorded(switching, start_daemon, engine,
                                                                           monkeypatch) -> None:
    for key, value in SPARK.items():
        monkeypatch.setenv(key, value)
    daemon = switching(small=False, park="auto")
    assert switch(daemon, B)["ok"]  # A is parked from here on
    awake_together = threading.Event()

    def watch() -> None:  # never both engines awake: they do not fit together
        while not stop.is_set():
            if sleeping(A) is False and sleeping(B) is False:
                awake_together.set()
            time.sleep(0.01)

    stop = threading.Event()
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        kill_during_switches(daemon, start_daemon, points=6, seed=20261201, within=0.8, settled=settled)
    finally:
        stop.set()
        watcher.join(30)
    assert not awake_together.is_set()


UNIFIED = 2 * GIB  # what stands for a GB10's unified memory: the sims allocate real memory scaled to it


def settled_available(within: int = 8 * MB, timeout: float = 30) -> int:
    """MemAvailable once it holds still (within `within` over three readings 0.1 s apart): freed
    pages come back to it over a moment, not at once."""
    readings = [available()]

    def still() -> bool:
        readings.append(available())
        return len(readings) >= 3 and max(readings[-3:]) - min(readings[-3:]) <= within

    deadline = time.monotonic() + timeout
    while not still():
        assert time.monotonic() < deadline, f"MemAvailable still moving: {[r // MB for r in readings[-5:]]} MB"
        time.sleep(0.1)
    return readings[-1]


def heavy(world, name: str, *, fraction: float, weights: int, port_: int, env: str = "") -> None:
    """A stack whose model dir has a weights file of `weights` bytes, on a sim engine that holds
    real memory: `fraction` of UNIFIED awake."""
    model = write_model(world / f"model-{name}", weights=False)
    with (model / "model.safetensors").open("wb") as f:
        f.truncate(weights)  # sized, not filled: the sim and the planner only measure it
    (world / "stacks" / f"{name}.yaml").write_text(
        f"name: {name}\nextends: qwen36-nvfp4-stock\nmodel: {{repo: null, path: {model}}}\n"
        f"vllm: {{port: {port_}, served_model_name: {name}}}\n"
        f"resources: {{gpu_memory_utilization: {fraction}}}\nswitch: {{bench: 'off'}}\n"
        f"container: {{env: {{SPARKCTL_SIM_MEMORY_SCALE: '{UNIFIED / meminfo('MemTotal')!r}'{env}}}}}\n")


def rss(engine, stack: str) -> int:
    """The resident anonymous memory of the stack's engine process."""
    [c] = [c for c in containers(engine, stack) if c["State"] == "running"] or [None]
    if c is None:
        return 0
    pid = engine.inspect(c["Id"])["State"]["Pid"]
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("RssAnon:")[1].split()[0]) * 1024


@pytest.fixture
def memory_world(world, start_daemon, monkeypatch):
    """A daemon whose fractions are of UNIFIED, parked stacks keeping a residue of 0.05 of it."""
    monkeypatch.setenv("SPARKCTL_MEMORY_TOTAL_GIB", repr(UNIFIED / GIB))
    monkeypatch.setenv("SPARKCTL_PARK_RESIDUE_GIB", repr(0.05 * UNIFIED / GIB))
    monkeypatch.setenv("SPARKCTL_ENGINE_ENV", "SPARKCTL_SIM_TIME_SCALE=0.01,SPARKCTL_SIM_LOAD_SCALE=0.002")
    (world / "state").mkdir(exist_ok=True)
    (world / "state" / "desired.yaml").write_text("stacks: [a]\naliases: {primary: a}\n")
    return world


def test_auto_parks_at_level_1_level_2_or_stops_as_memory_allows(memory_world, start_daemon, engine, cli) -> None:
    """`a` (0.3 awake, weights 0.15) leaves `primary` three times: beside `b` (0.3) its level-1
    peak fits; beside `c` (0.58) only level 2 does; `d` (0.86) fits only once `a` has gone, and
    then not even a sleeping engine's residue fits beside it. The plan says so, and `a`'s engine
    and MemAvailable show what it really let go."""
    weights = int(0.15 * UNIFIED)
    heavy(memory_world, "a", fraction=0.3, weights=weights, port_=8171)
    for name, fraction, port_ in (("b", 0.3, 8172), ("c", 0.58, 8173), ("d", 0.86, 8174)):
        heavy(memory_world, name, fraction=fraction, weights=16 << 20, port_=port_)
    daemon = start_daemon()
    gateway = f"http://127.0.0.1:{os.environ['SPARKCTL_GATEWAY_PORT']}"
    wait_for(lambda: routed(gateway) == "a", timeout=60, what="primary routed", logs=daemon.logs)
    seen = {}
    for new, expected in (("b", "sleep1"), ("c", "sleep2"), ("d", "stop")):
        awake, before = rss(engine, "a"), available()
        outcome = switch(daemon, new)
        assert outcome["ok"], outcome.get("error")
        plan = outcome["result"]
        assert plan["park"] == expected and f"a leaves by {expected}" in plan["why"], plan["why"]
        kept, after = rss(engine, "a"), available()
        seen[expected] = (awake - kept, before - after)
        print(f"{expected}: {plan['why']}\n  a's engine let go {(awake - kept) / MB:.0f} MB; MemAvailable moved "
              f"{(after - before) / MB:+.0f} MB")
        if expected != "stop":
            assert switch(daemon, "a")["ok"]  # a wakes
            assert cli("down", new)[0] == 0
    awake_bytes = 0.3 * UNIFIED
    assert seen["sleep1"][0] == pytest.approx(awake_bytes - weights, abs=40 * MB)  # keeps its weights
    assert seen["sleep2"][0] == pytest.approx(awake_bytes, abs=40 * MB)  # keeps nothing
    assert seen["stop"][0] > awake_bytes  # its process is gone
    # MemAvailable: b took 0.3 while a let go 0.15; c took 0.58 while a let go 0.3 (other
    # processes move it too, and each new engine's interpreter takes ~100 MB)
    assert seen["sleep1"][1] == pytest.approx(0.15 * UNIFIED, abs=200 * MB)
    assert seen["sleep2"][1] == pytest.approx(0.28 * UNIFIED, abs=200 * MB)


def test_a_wake_that_eats_the_floor_is_killed_and_the_digest_parks_by_stopping_after(
        memory_world, start_daemon, engine, monkeypatch) -> None:
    """vLLM #50011's wake (the weights' host copy kept while the KV cache comes back) on a plan
    where that peak crosses the floor: the watchdog kills the engine before memory runs out, the
    stack starts cold and serves, and its digest is marked: next time it parks by stopping."""
    weights = int(0.15 * UNIFIED)
    slow_wake = ", SPARKCTL_SIM_TIME_SCALE: '1', SPARKCTL_SIM_FAULTS: wake_keeps_backup"
    heavy(memory_world, "a", fraction=0.3, weights=weights, port_=8171, env=slow_wake)
    heavy(memory_world, "b", fraction=0.3, weights=16 << 20, port_=8172)
    daemon = start_daemon()
    gateway = f"http://127.0.0.1:{os.environ['SPARKCTL_GATEWAY_PORT']}"
    wait_for(lambda: routed(gateway) == "a", timeout=60, what="primary routed", logs=daemon.logs)
    assert switch(daemon, "b")["result"]["park"] == "sleep1"
    # A correct level-1 wake takes at most awake - weights more; #50011's takes awake: the floor
    # lies between, from what is available now.
    floor = settled_available() - int(0.3 * UNIFIED - weights / 2)  # once the pages `a` freed are back
    daemon.stop()
    monkeypatch.setenv("SPARKCTL_WAKE_MEMORY_FLOOR_GIB", repr(floor / GIB))
    daemon = start_daemon()
    outcome = switch(daemon, "a")
    assert outcome["ok"], outcome.get("error")
    woken = outcome["result"]["woken"]
    assert woken["killed"] and "under the floor" in woken["killed"], woken
    assert woken["lowest_available"] > floor - 64 * MB  # killed within a step of the floor
    assert routed(gateway) == "a"
    events = [e for e in daemon.client.get("/v1/history")["events"] if e["stack"] == "a"]
    assert any(e["kind"] == "wake killed" for e in events)
    wakes = YAML(typ="safe").load((memory_world / "stacks" / "images.yaml").read_text())["wakes"]
    [(digest, record)] = wakes.items()
    assert record["ok"] is False and "under the floor" in record["reason"]
    outcome = switch(daemon, "b")
    assert outcome["ok"] and outcome["result"]["park"] == "stop", outcome
    assert f"image {digest} cannot sleep and wake" in outcome["result"]["why"]


def test_requests_for_a_parked_stack_wake_it_on_demand(switching, engine, monkeypatch) -> None:
    """A parked stack's served name, and an alias parked under it, wake it for the requests that
    name them: they are held for the wake (one wake, however many requests), then answered by it.
    A wake that does not fit in memory answers 503 with the reason."""
    for key, value in SPARK.items():
        monkeypatch.setenv(key, value)
    third = "name: third\nextends: qwen36-nvfp4-stock\nresources: {gpu_memory_utilization: 0.4}\n"
    daemon = switching(small=True, park="auto", extra={"third": third})
    assert switch(daemon, B)["result"]["park"] == "sleep1"  # blue/green: A parks after the flip
    models = json.loads(urllib.request.urlopen(daemon.gateway + "/v1/models").read())["data"]
    assert {"id": "qwen36-dflash", "object": "model", "owned_by": "sparkctl", "root": A, "parked": True} in models
    agent = openai.OpenAI(base_url=daemon.gateway + "/v1", api_key="x", max_retries=0, timeout=60)
    replies: list = []
    asks = [threading.Thread(target=lambda: replies.append(agent.completions.create(
        model="qwen36-dflash", prompt="hi", max_tokens=4))) for _ in range(8)]
    for t in asks:
        t.start()
    for t in asks:
        t.join(60)
    assert [r.model for r in replies] == ["qwen36-dflash"] * 8
    assert sleeping(A) is False and daemon.client.get("/v1/desired")["parked"] == {}
    woke = [e for e in daemon.client.get("/v1/history")["events"] if e["kind"] == "woke"]
    assert [(e["stack"], e["detail"]) for e in woke] == [(A, "from level 1")]
    # The alias's own stack, parked by hand: `primary` wakes it.
    assert last(daemon, "/v1/park", stack=B, how="auto")["ok"]
    assert agent.completions.create(model="primary", prompt="hi", max_tokens=4).model == "aeon-gemma4"
    # Parked again, with a third stack taking the room it would wake into: refused, with the reason.
    assert last(daemon, "/v1/park", stack=B, how="auto")["ok"]
    assert last(daemon, "/v1/up", stack="third")["ok"]
    with pytest.raises(openai.InternalServerError) as refused:
        agent.completions.create(model="primary", prompt="hi", max_tokens=4)
    assert refused.value.status_code == 503 and "waking aeon-gemma4-v2 failed" in str(refused.value.body)
    assert "does not fit" in str(refused.value.body) and sleeping(B) is True


def test_an_idle_stack_parks_itself_and_the_next_request_wakes_it(switching, world, monkeypatch) -> None:
    for key, value in SPARK.items():
        monkeypatch.setenv(key, value)
    daemon = switching(small=True, park="auto")
    amend(world / "stacks" / f"{B}.yaml", switch={"bench": "off", "park": "auto", "idle_park": 1})
    assert last(daemon, "/v1/up", stack=B)["ok"]
    agent = openai.OpenAI(base_url=daemon.gateway + "/v1", api_key="x", max_retries=0, timeout=60)
    with Load(daemon.gateway + "/v1", width=2) as load:  # primary (A, no idle_park) keeps busy meanwhile
        wait_for(lambda: daemon.client.get("/v1/desired")["parked"] == {B: 1}, timeout=30, what="B idle-parked",
                 logs=daemon.logs)
        # desired.yaml records the park before the engine is asked: its sleep follows
        wait_for(lambda: sleeping(B) is True, timeout=30, what="B's engine asleep", logs=daemon.logs)
        assert sleeping(A) is False
        assert agent.completions.create(model="aeon-gemma4", prompt="hi", max_tokens=4).model == "aeon-gemma4"
    assert load.failures() == [] and daemon.client.get("/v1/desired")["parked"] == {}
