"""Parking with vLLM's sleep mode through a real daemon, real dockerd and sim engines that sleep
and wake with vLLM's endpoints: switches under load that wake the parked stack instead of a cold
start, wakes on demand, idle stacks parking themselves, and a daemon killed while stacks park or
wake. What reads the machine's memory is in memory/test_wake_memory.py."""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request

import openai
import pytest

from tests.conftest import image_policy, port
from tests.integration.agents import A, B, Load, amend, kill_during_switches, routed, switch
from tests.integration.conftest import containers, wait_for

PORTS = {A: 8107, B: 8110}
MB = 1 << 20
# Fractions as on a GB10. Sleeping and waking is what these tests are about: GB10's bound on a
# wake's KV region (which these stacks' 91 GiB are over) is lifted; test_sleep_rules.py keeps it.
SPARK = {"SPARKCTL_MEMORY_TOTAL_GIB": "119", "SPARKCTL_PARK_RESIDUE_GIB": "2", "SPARKCTL_WAKE_KV_MAX_GIB": "119"}


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


def test_requests_for_a_parked_stack_wake_it_on_demand(switching, world, engine, monkeypatch) -> None:
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
    [(digest, wake)] = image_policy(world).wakes.items()  # the daemon's wake ledger, in the state
    assert wake.ok and digest.startswith("sha256:")
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
