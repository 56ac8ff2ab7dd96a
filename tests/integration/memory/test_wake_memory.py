"""Parking against the machine's real memory: `auto` choosing level 1, level 2 or stop by the
memory sim engines really allocate, and the wake watchdog killing vLLM #50011's wake before
MemAvailable crosses its floor.

These read MemAvailable, which every process on the machine moves: `scripts/tiers.sh` runs this
directory as the `memory` tier, alone, never beside another tier's engines loading or exiting."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sparkctl.deploy.memory import GIB, available, meminfo
from tests.conftest import image_policy
from tests.fakes.tinymodel import write_model
from tests.integration.agents import routed, switch
from tests.integration.conftest import containers, wait_for

MB = 1 << 20

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
        f"name: {name}\nextends: qwen36-nvfp4-stock\nmodel: {{repo: null, path: {model}}}\nallow: [host-path]\n"
        f"vllm: {{port: {port_}, served_model_name: {name}}}\n"
        f"resources: {{gpu_memory_utilization: {fraction}}}\nswitch: {{bench: 'off'}}\n"
        f"container: {{env: {{SPARKCTL_SIM_MEMORY_SCALE: '{UNIFIED / meminfo('MemTotal')!r}'{env}}}}}\n")


def rss(engine, stack: str) -> int:
    """The resident anonymous memory of the stack's engine process."""
    [c] = [c for c in containers(engine, stack) if c["State"] == "running"] or [None]
    if c is None:
        return 0
    pid = engine.client.api.inspect_container(c["Id"])["State"]["Pid"]
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("RssAnon:")[1].split()[0]) * 1024


@pytest.fixture
def memory_world(world, start_daemon, monkeypatch):
    """A daemon whose fractions are of UNIFIED, parked stacks keeping a residue of 0.05 of it."""
    monkeypatch.setenv("SPARKCTL_MEMORY_TOTAL_GIB", repr(UNIFIED / GIB))
    monkeypatch.setenv("SPARKCTL_PARK_RESIDUE_GIB", repr(0.05 * UNIFIED / GIB))
    monkeypatch.setenv("SPARKCTL_ENGINE_OVERHEAD_GIB", "0")  # a KV cache of the whole fraction but the weights
    # The wake watchdog alone is under test: the sentinel shares its floor (set high here) and reads the
    # workspace's still copy of meminfo, so it would stop an engine first (test_sentinel_memory.py is its own).
    monkeypatch.setenv("SPARKCTL_SENTINEL", "0")
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
    [(digest, record)] = image_policy(memory_world).wakes.items()
    assert record.ok is False and "under the floor" in record.reason
    outcome = switch(daemon, "b")
    assert outcome["ok"] and outcome["result"]["park"] == "stop", outcome
    assert f"image {digest} cannot sleep and wake" in outcome["result"]["why"]
